// Copy-engine ring shift: IPC handles of the windows and events are swapped with the neighbours once;
// every step then costs two tiny MPI messages per rank and one cudaMemcpyAsync.
#include "collectives/peer_copy_ring.h"

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "collectives/mpi_check.h"
#include "collectives/ring_neighbours.h"
#include "runtime/cuda_device.h"

namespace ra {
namespace {

using Clock = std::chrono::steady_clock;

enum Tag : int { kFreeTag = 1, kPushedTag = 2 };

cudaEvent_t make_interprocess_event() {
  cudaEvent_t event = nullptr;
  RA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess));
  return event;
}

// Sends `mine` to `to` and receives the same type from `from` (the handle swaps of the set-up).
template <typename T>
T swap_with(const T& mine, int to, int from, int tag, MPI_Comm comm) {
  T theirs{};
  RA_MPI_CHECK(MPI_Sendrecv(&mine, sizeof(T), MPI_BYTE, to, tag, &theirs, sizeof(T), MPI_BYTE, from, tag, comm,
                            MPI_STATUS_IGNORE));
  return theirs;
}

class PeerCopyExchange final : public PendingExchange {
 public:
  PeerCopyExchange(cudaEvent_t done, int step, int rank, int previous, int next)
      : done_(done), step_(step), rank_(rank), previous_(previous), next_(next) {}
  void wait(std::chrono::milliseconds timeout) override {
    const cudaError_t status = poll_event(done_, timeout);
    RA_CHECK(status != cudaErrorTimeout, "ring step ", step_, " (copy engines): rank ", rank_, " waited ",
             timeout.count(), " ms for its copy to rank ", next_, " and the one from rank ", previous_, " to finish");
    RA_CHECK(status == cudaSuccess, "ring step ", step_, " (copy engines): rank ", rank_, " waiting for its copy to rank ",
             next_, " and the one from rank ", previous_, ": CUDA error ", cudaGetErrorName(status));
  }

 private:
  cudaEvent_t done_;
  int step_, rank_, previous_, next_;
};

}  // namespace

bool PeerCopyRing::supported(MpiCommunicator& host, std::string* why) {
  const int size = host.size(), rank = host.rank();
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int name_len = 0;
  RA_MPI_CHECK(MPI_Get_processor_name(name, &name_len));
  int device = 0;
  char bus_id[32] = {};
  RA_CUDA_CHECK(cudaGetDevice(&device));
  RA_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device));
  const RingNodeInfo mine = ring_node_info(std::string_view(name, size_t(name_len)), bus_id);
  std::vector<RingNodeInfo> all(static_cast<size_t>(size));
  host.all_gather(&mine, all.data(), sizeof(RingNodeInfo));
  const int next_rank = (rank + 1) % size;
  std::string reason = copy_engine_obstacle(mine, all[size_t(next_rank)], rank, next_rank, [&](const char* next_bus) {
    int next_device = -1, can_access = 0;
    if (cudaDeviceGetByPCIBusId(&next_device, next_bus) != cudaSuccess) {
      (void)cudaGetLastError();
      return detail::concat("rank ", rank, " cannot see the GPU of rank ", next_rank, " (", next_bus, ")");
    }
    if (next_device != device &&
        (cudaDeviceCanAccessPeer(&can_access, device, next_device) != cudaSuccess || !can_access)) {
      (void)cudaGetLastError();
      return detail::concat("GPU ", device, " of rank ", rank, " has no peer access to GPU ", next_device);
    }
    return std::string();  // a GPU shared with the next rank: the copies stay in its memory (IPC maps it)
  });
  if (reason.empty()) {
    // Interprocess events live in shared-memory files: a file-size limit (ulimit -f) or a small /dev/shm
    // makes them fail, and that must be known here, while every rank can still choose NCCL together.
    cudaEvent_t probe = nullptr;
    cudaIpcEventHandle_t handle{};
    cudaError_t status = cudaEventCreateWithFlags(&probe, cudaEventDisableTiming | cudaEventInterprocess);
    if (status == cudaSuccess) status = cudaIpcGetEventHandle(&handle, probe);
    if (probe) (void)cudaEventDestroy(probe);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      reason = detail::concat("rank ", rank, " cannot make an interprocess CUDA event (", cudaGetErrorName(status), ")");
    }
  }
  int64_t ok = reason.empty() ? 1 : 0;
  host.all_reduce(&ok, 1, ReduceOp::kMin);
  if (why != nullptr) *why = reason.empty() && !ok ? "another rank's next rank is not reachable this way" : reason;
  return ok == 1;
}

PeerCopyRing::PeerCopyRing(const MpiCommunicator& host, void* window, size_t bytes, cudaStream_t stream)
    : bytes_(bytes), stream_(stream) {
  RA_MPI_CHECK(MPI_Comm_dup(host.comm(), &comm_));
  rank_ = host.rank(), size_ = host.size();
  next_ = (rank_ + 1) % size_, previous_ = (rank_ + size_ - 1) % size_;
  free_ = make_interprocess_event();
  pushed_ = make_interprocess_event();
  RA_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  // The previous rank writes into this window and waits on free_; the next rank waits on pushed_.
  cudaIpcMemHandle_t window_handle{};
  cudaIpcEventHandle_t free_handle{}, pushed_handle{};
  RA_CUDA_CHECK(cudaIpcGetMemHandle(&window_handle, window));
  RA_CUDA_CHECK(cudaIpcGetEventHandle(&free_handle, free_));
  RA_CUDA_CHECK(cudaIpcGetEventHandle(&pushed_handle, pushed_));
  const auto next_window = swap_with(window_handle, previous_, next_, 11, comm_);
  const auto next_free = swap_with(free_handle, previous_, next_, 12, comm_);
  const auto previous_pushed = swap_with(pushed_handle, next_, previous_, 13, comm_);
  void* mapped = nullptr;
  RA_CUDA_CHECK(cudaIpcOpenMemHandle(&mapped, next_window, cudaIpcMemLazyEnablePeerAccess));
  next_window_ = static_cast<char*>(mapped);
  RA_CUDA_CHECK(cudaIpcOpenEventHandle(&next_free_, next_free));
  RA_CUDA_CHECK(cudaIpcOpenEventHandle(&previous_pushed_, previous_pushed));
}

PeerCopyRing::~PeerCopyRing() {
  (void)cudaStreamSynchronize(stream_);
  if (std::uncaught_exceptions() == 0) {  // when unwinding, a peer may be gone: nothing that waits on it
    complete_sends();
    MPI_Barrier(comm_);  // no peer's stream still waits on this rank's events
  }
  if (next_window_) (void)cudaIpcCloseMemHandle(next_window_);
  for (cudaEvent_t e : {next_free_, previous_pushed_, free_, pushed_, done_})
    if (e) (void)cudaEventDestroy(e);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void PeerCopyRing::complete_sends() {
  for (MPI_Request& request : send_requests_)
    if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);
}

void PeerCopyRing::announce(int peer, int tag, int step) {
  // One request per tag; the previous one has been received by now (see shift()), so this wait is short.
  const int slot = tag == kFreeTag ? 0 : 1;
  if (send_requests_[slot] != MPI_REQUEST_NULL) RA_MPI_CHECK(MPI_Wait(&send_requests_[slot], MPI_STATUS_IGNORE));
  send_payload_[slot] = step;
  RA_MPI_CHECK(MPI_Isend(&send_payload_[slot], 1, MPI_INT, peer, tag, comm_, &send_requests_[slot]));
}

void PeerCopyRing::await_announcement(int peer, int tag, int step, std::chrono::milliseconds timeout,
                                      const char* what) {
  int got = -1, done = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  RA_MPI_CHECK(MPI_Irecv(&got, 1, MPI_INT, peer, tag, comm_, &request));
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    RA_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) break;
    if (Clock::now() > deadline) {
      MPI_Cancel(&request);
      RA_FAIL("ring step ", step, " (copy engines): rank ", rank_, " waited ", timeout.count(), " ms for rank ", peer,
              " to announce ", what, " (is rank ", peer, " alive and at the same step?)");
    }
    std::this_thread::yield();
  }
  RA_CHECK(got == step, "ring step ", step, " (copy engines): rank ", peer, " announced ", what, " for step ", got,
           " to rank ", rank_, ": the ranks are out of step");
}

std::unique_ptr<PendingExchange> PeerCopyRing::shift(const std::vector<Piece>& pieces, int step,
                                                     std::chrono::milliseconds timeout) {
  for (const Piece& piece : pieces)
    RA_CHECK(piece.offset + piece.bytes <= bytes_, "ring step ", step, " (copy engines): ", piece.bytes,
             " bytes at offset ", piece.offset, " do not fit the ", bytes_, "-byte window");
  // Ordering of the announcements (every rank runs the same): free(s) goes out before this rank waits
  // for anything, and pushed(s) only after the next rank's free(s) arrived; so each rank's step s
  // needs only its neighbours' step s - 1 and its own announcements, and no wait closes a cycle. An
  // event is recorded again (step s + 1) only after the peer queued its wait for step s.
  RA_CUDA_CHECK(cudaEventRecord(free_, stream_));
  announce(previous_, kFreeTag, step);
  await_announcement(next_, kFreeTag, step, timeout, "that its window is free");
  RA_CUDA_CHECK(cudaStreamWaitEvent(stream_, next_free_, 0));
  for (const Piece& piece : pieces)
    RA_CUDA_CHECK(cudaMemcpyAsync(next_window_ + piece.offset, piece.source, piece.bytes, cudaMemcpyDeviceToDevice, stream_));
  RA_CUDA_CHECK(cudaEventRecord(pushed_, stream_));
  announce(next_, kPushedTag, step);
  await_announcement(previous_, kPushedTag, step, timeout, "its copy into this rank's window");
  RA_CUDA_CHECK(cudaStreamWaitEvent(stream_, previous_pushed_, 0));
  RA_CUDA_CHECK(cudaEventRecord(done_, stream_));
  return std::make_unique<PeerCopyExchange>(done_, step, rank_, previous_, next_);
}

}  // namespace ra
