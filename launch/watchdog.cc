#include "launch/watchdog.h"

#include <cstdio>

#include "collectives/mpi_session.h"
#include "launch/commands.h"
#include "runtime/activity.h"

namespace ra::cli {

Watchdog::Watchdog(int rank) : rank_(rank), thread_([this] { watch(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Watchdog::phase(const std::string& phase, std::chrono::seconds deadline) {
  {
    std::lock_guard lock(mutex_);
    phase_ = phase;
    budget_ = deadline;
    set_activity("%s", phase.c_str());  // the ring refines it step by step
    deadline_ = std::chrono::steady_clock::now() + deadline;
  }
  changed_.notify_all();
}

void Watchdog::disarm() {
  {
    std::lock_guard lock(mutex_);
    deadline_ = std::chrono::steady_clock::time_point::max();
  }
  changed_.notify_all();
}

void Watchdog::watch() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (deadline_ == std::chrono::steady_clock::time_point::max()) {
      changed_.wait(lock);
      continue;
    }
    if (changed_.wait_until(lock, deadline_) == std::cv_status::timeout && !stop_ &&
        std::chrono::steady_clock::now() >= deadline_) {
      std::fprintf(stderr, "[rank %d] ringattn: error: %s did not finish within %lld s (a peer rank died or "
                   "stalled); aborting the job\n", rank_, phase_.c_str(), static_cast<long long>(budget_.count()));
      std::fflush(stderr);
      remove_partial_output();
      MpiSession::abort_job(kRuntimeFailure);
    }
  }
}

}  // namespace ra::cli
