// A per-process watchdog for the phases of a run that have no deadline of their own (the ring's
// exchanges have one; collective reads, checks and writes do not): when a phase outlives its
// deadline, because a peer died or stalled outside the ring, the rank says which phase and aborts
// the whole job, instead of waiting forever in a collective.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace ra::cli {

class Watchdog {
 public:
  explicit Watchdog(int rank);
  ~Watchdog();  // disarms
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts timing `phase`; the previous phase is done.
  void phase(const std::string& phase, std::chrono::seconds deadline);
  void disarm();

 private:
  void watch();

  int rank_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::string phase_;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  std::chrono::seconds budget_{0};
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ra::cli
