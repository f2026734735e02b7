// A ring shift between the GPUs of one node on their copy engines. Each rank's receive window is
// mapped (CUDA IPC) into the rank before it, which writes the next block into it with
// cudaMemcpyAsync: no kernel runs, so the attention kernels beside the transfer keep every SM (NCCL's
// send/recv kernels hold some, and the attention kernels next to them run about 10% slower; see
// bench/RESULTS.md). Order across the two processes comes from interprocess CUDA events. A stream
// waits only for records made before its wait was queued, so every record is announced to the peer
// over MPI and the peer queues its wait after the announcement arrived.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"

namespace ra {

class PeerCopyRing {
 public:
  // Collective over `host`: true on every rank when each rank's next rank runs on the same node and
  // its GPU can be mapped from this rank's current GPU (peer access); false on every rank otherwise,
  // with `why` (when given) saying which rank could not.
  static bool supported(MpiCommunicator& host, std::string* why = nullptr);

  // Collective over `host` (the ring's ranks in ring order, its current device on each): `window` is
  // where this rank receives (from one cudaMalloc, `bytes` long on every rank); the next rank's window
  // is mapped here. `stream` carries this rank's copies and its waits for the peers' events.
  PeerCopyRing(const MpiCommunicator& host, void* window, size_t bytes, cudaStream_t stream);
  // Waits for the stream; outside error unwinding, also for every rank of the ring (a peer's stream
  // may still wait on this rank's events), then closes the mappings.
  ~PeerCopyRing();
  PeerCopyRing(const PeerCopyRing&) = delete;
  PeerCopyRing& operator=(const PeerCopyRing&) = delete;

  size_t window_bytes() const { return bytes_; }

  // Bytes to copy into the next rank's window: `bytes` from `source` (device) to `offset` in it.
  struct Piece {
    const void* source;
    size_t offset, bytes;
  };

  // Ring step `step`, queued on the stream: announces to the previous rank that this rank's window
  // may be written (whatever last read it must be ordered before, on the stream); once the next rank
  // announced the same, copies the pieces into the next rank's window (one copy each, in order); then
  // waits for the previous rank's copies into this window. The host blocks only for announcements (a
  // few microseconds when the peers keep pace), at most `timeout`, and then throws naming the step
  // and peer. The returned exchange waits for the stream's part.
  std::unique_ptr<PendingExchange> shift(const std::vector<Piece>& pieces, int step, std::chrono::milliseconds timeout);
  std::unique_ptr<PendingExchange> shift(const void* send, size_t offset, size_t bytes, int step,
                                         std::chrono::milliseconds timeout) {
    return shift({Piece{send, offset, bytes}}, step, timeout);
  }

 private:
  void announce(int peer, int tag, int step);
  void await_announcement(int peer, int tag, int step, std::chrono::milliseconds timeout, const char* what);
  void complete_sends();

  MPI_Comm comm_ = MPI_COMM_NULL;  // a duplicate: announcements never mix with other traffic
  int rank_ = 0, size_ = 1, next_ = 0, previous_ = 0;
  size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  char* next_window_ = nullptr;  // the next rank's window, mapped here
  // Recorded here: `free_` once this window may be written, `pushed_` once this rank's copy into the
  // next rank's window is done. Opened from the peers: the next rank's free_, the previous rank's pushed_.
  cudaEvent_t free_ = nullptr, pushed_ = nullptr, next_free_ = nullptr, previous_pushed_ = nullptr;
  cudaEvent_t done_ = nullptr;  // this rank's part of the last shift
  static constexpr int kSendSlots = 2;
  int send_payload_[kSendSlots] = {};
  MPI_Request send_requests_[kSendSlots] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

}  // namespace ra
