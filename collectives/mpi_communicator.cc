// MPI back end: a duplicated communicator with MPI_ERRORS_RETURN, and the ring shift as
// Isend/Irecv progressed on a helper thread with a deadline. Under MPI_THREAD_SERIALIZED only one
// thread may be inside MPI at a time, and two exchanges can be in flight at once (the ring backward's
// K/V block and dK/dV accumulator, each with its helper thread): every MPI call here takes one lock.
#include "collectives/mpi_communicator.h"

#include <atomic>
#include <algorithm>
#include <climits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/mpi_check.h"
#include "runtime/fault_injection.h"

namespace ra {
namespace {

// Held around every MPI call of this file (helper threads and the caller's alike).
std::mutex& mpi_call_lock() {
  static std::mutex lock;
  return lock;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

// Byte counts travel as MPI_BYTE in chunks below INT_MAX.
constexpr size_t kMaxChunk = size_t(1) << 30;

class MpiExchange final : public PendingExchange {
 public:
  // `send_bytes` differs from `bytes` only under fault injection (a short send).
  MpiExchange(MPI_Comm comm, const void* send, size_t send_bytes, void* recv, size_t bytes, int tag, int next, int previous)
      : tag_(tag), next_(next), previous_(previous) {
    std::lock_guard<std::mutex> lock(mpi_call_lock());
    for (size_t off = 0; off < bytes || off == 0; off += kMaxChunk) {
      const int n = int(std::min(kMaxChunk, bytes - off));
      const int n_send = int(std::min(size_t(n), send_bytes - std::min(send_bytes, off)));
      requests_.emplace_back();
      expected_.push_back(n);
      RA_MPI_CHECK(MPI_Irecv(static_cast<char*>(recv) + off, n, MPI_BYTE, previous, tag, comm, &requests_.back()));
      requests_.emplace_back();
      expected_.push_back(-1);  // a send: nothing to check
      RA_MPI_CHECK(MPI_Isend(static_cast<const char*>(send) + off, n_send, MPI_BYTE, next, tag, comm, &requests_.back()));
      if (bytes == 0) break;
    }
    statuses_.resize(requests_.size());
  }
  ~MpiExchange() override {
    if (!waited_) {  // abandoned after an error: leave the requests to MPI_Abort
      stop_ = true;
      if (progress_.joinable()) progress_.join();
    }
  }
  // With MPI_THREAD_SERIALIZED or better a helper thread polls while the caller computes, so the
  // transfer moves meanwhile; wait() stops it and finishes polling on the caller's thread. Left to
  // the helper until completion, Open MPI's TCP transport stalled a ring step for 30-60 s in about
  // one run in ten (emulated hosts, tests/launch/multinode_test.sh); never with the caller finishing.
  void start_progress(bool threaded) {
    if (threaded) progress_ = std::thread([this] { poll(std::chrono::steady_clock::time_point::max()); });
  }
  void wait(std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (progress_.joinable()) {  // the caller takes over: see start_progress
      stop_ = true;
      progress_.join();
      stop_ = false;
    }
    if (!done_) poll(deadline);
    if (!done_) {
      stop_ = true;
      RA_FAIL("ring step ", tag_, ": no data from rank ", previous_, " (or rank ", next_,
              " did not take ours) within ", timeout.count(), " ms; aborting");
    }
    if (progress_.joinable()) progress_.join();
    waited_ = true;
    RA_CHECK(status_ == MPI_SUCCESS, "ring step ", tag_, ": exchange with ranks ", previous_, "/", next_,
             " failed: ", mpi_error_string(status_));
    // A message shorter than the receive buffer completes the receive too: count what came.
    int64_t received = 0, expected = 0;
    std::lock_guard<std::mutex> lock(mpi_call_lock());
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (expected_[i] < 0) continue;
      int count = 0;
      MPI_Get_count(&statuses_[i], MPI_BYTE, &count);
      received += count;
      expected += expected_[i];
    }
    RA_CHECK(received == expected, "ring step ", tag_, ": received ", received, " of ", expected,
             " bytes from rank ", previous_, " (a short send); the block was not used");
  }

 private:
  void poll(std::chrono::steady_clock::time_point deadline) {
    int flag = 0;
    while (!stop_ && std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mpi_call_lock());
        status_ = MPI_Testall(int(requests_.size()), requests_.data(), &flag, statuses_.data());
      }
      if (flag || status_ != MPI_SUCCESS) {
        done_ = true;
        return;
      }
      std::this_thread::yield();
    }
  }

  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
  std::vector<int> expected_;  // bytes each receive expects; -1 for sends
  std::thread progress_;
  std::atomic<bool> done_{false}, stop_{false};
  bool waited_ = false;
  int status_ = MPI_SUCCESS;
  int tag_, next_, previous_;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  RA_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  threaded_progress_ = provided >= MPI_THREAD_SERIALIZED;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<PendingExchange> MpiCommunicator::ring_shift(const void* send, void* recv, size_t bytes, int tag) {
  const size_t send_bytes = injected_send_bytes(fault_, rank_, tag, bytes);
  auto exchange = std::make_unique<MpiExchange>(comm_, send, send_bytes, recv, bytes, tag, next(), previous());
  exchange->start_progress(threaded_progress_);
  return exchange;
}

void MpiCommunicator::all_reduce(double* data, size_t count, ReduceOp op) {
  std::lock_guard<std::mutex> lock(mpi_call_lock());
  RA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, int(count), MPI_DOUBLE, mpi_op(op), comm_));
}

void MpiCommunicator::all_reduce(int64_t* data, size_t count, ReduceOp op) {
  std::lock_guard<std::mutex> lock(mpi_call_lock());
  RA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, int(count), MPI_INT64_T, mpi_op(op), comm_));
}

void MpiCommunicator::all_reduce_within(int64_t* data, size_t count, ReduceOp op, std::chrono::milliseconds timeout,
                                        const char* what) {
  mpi_all_reduce_within(comm_, data, count, op, timeout, what);
}

void mpi_all_reduce_within(MPI_Comm comm, int64_t* data, size_t count, ReduceOp op, std::chrono::milliseconds timeout,
                           const char* what) {
  // The values travel in a buffer of their own: MPI may still write one that timed out, long after we return.
  auto values = std::make_unique<std::vector<int64_t>>(data, data + count);
  MPI_Request request = MPI_REQUEST_NULL;
  {
    std::lock_guard<std::mutex> lock(mpi_call_lock());
    RA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values->data(), int(count), MPI_INT64_T, mpi_op(op), comm, &request));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int done = 0;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mpi_call_lock());
      RA_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    }
    if (done) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      (void)values.release();  // left to the pending collective (freeing its request is erroneous)
      int size = 0;
      MPI_Comm_size(comm, &size);
      RA_FAIL(what, ": not every one of the ", size, " ranks joined within ", timeout.count(),
              " ms (a rank stopped before this call, or is late); aborting");
    }
    std::this_thread::yield();
  }
  std::copy(values->begin(), values->end(), data);
}

void MpiCommunicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
  RA_CHECK(bytes_per_rank < size_t(INT_MAX), "all_gather of ", bytes_per_rank, " bytes per rank is too large");
  std::lock_guard<std::mutex> lock(mpi_call_lock());
  RA_MPI_CHECK(MPI_Allgather(send, int(bytes_per_rank), MPI_BYTE, recv, int(bytes_per_rank), MPI_BYTE, comm_));
}

void MpiCommunicator::broadcast(void* data, size_t bytes, int root) {
  RA_CHECK(bytes < size_t(INT_MAX), "broadcast of ", bytes, " bytes is too large");
  std::lock_guard<std::mutex> lock(mpi_call_lock());
  RA_MPI_CHECK(MPI_Bcast(data, int(bytes), MPI_BYTE, root, comm_));
}

void MpiCommunicator::barrier() {
  std::lock_guard<std::mutex> lock(mpi_call_lock());
  RA_MPI_CHECK(MPI_Barrier(comm_));
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key) const {
  MPI_Comm sub;
  RA_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  auto out = std::make_unique<MpiCommunicator>(sub);
  MPI_Comm_free(&sub);
  return out;
}

}  // namespace ra
