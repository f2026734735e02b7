// The NCCL back end of Communicator over device memory, bootstrapped from an MPI communicator (rank
// 0's ncclUniqueId is broadcast over it) or from a unique id the caller broadcast itself (torchrun).
// The NCCL communicator is non-blocking: every wait polls ncclCommGetAsyncError against a deadline, and on an error or a timeout the communicator is aborted
// and an ra::Error names the step and the peers, so that no rank hangs in a dead collective.
//
// ring_shift, all_gather and broadcast take device pointers and are queued on this communicator's
// own stream; all_reduce and barrier take host values (small, staged through the device).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>

#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"
#include "runtime/cuda_device.h"

struct ncclComm;  // nccl.h stays out of this header: attention/ includes it

namespace ra {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`. The calling thread's current CUDA device is the one used.
  explicit NcclCommunicator(const MpiCommunicator& bootstrap,
                            std::chrono::milliseconds init_timeout = std::chrono::seconds(120));
  // Collective over the `size` processes that pass the same `unique_id` (the bytes of rank 0's
  // unique_id(), carried to the others by the caller, e.g. over torch.distributed), each its own `rank`.
  NcclCommunicator(const std::string& unique_id, int rank, int size,
                   std::chrono::milliseconds init_timeout = std::chrono::seconds(120));
  // A new ncclUniqueId's bytes, for the constructor above.
  static std::string unique_id();
  // What that constructor refuses (a unique id of the wrong size, a rank outside the size), named; callers
  // that must refuse before touching a device check it first.
  static void check_arguments(const std::string& unique_id, int rank, int size);
  // Uses the caller's communicator (blocking or not) without owning it: it is neither finalized nor
  // destroyed here, though a failure still aborts it (a failed NCCL communicator is unusable anyway).
  static std::unique_ptr<NcclCommunicator> adopt(ncclComm* comm);
  // Collective over this communicator (ncclCommSplit): ranks with the same `color` form a new
  // communicator, ordered by `key`; a mesh axis is the ranks that agree on every other coordinate.
  // The new one is non-blocking too, with its own stream; `what` names it in errors.
  std::unique_ptr<NcclCommunicator> split(int color, int key, const std::string& what);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "nccl"; }
  bool carries_device_memory() const override { return true; }
  // High priority: the transfers it carries start while a long compute kernel still holds the SMs.
  cudaStream_t stream() const { return stream_.get(); }

  // The next operation queued on stream() starts only after `event` (recorded by the caller).
  void stream_wait(cudaEvent_t event);

  std::unique_ptr<PendingExchange> ring_shift(const void* send, void* recv, size_t bytes, int tag) override;
  void all_reduce(double* data, size_t count, ReduceOp op) override;
  void all_reduce(int64_t* data, size_t count, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;

  // The deadline of each operation (a ring step's exchange included); the ring sets its step timeout.
  void set_timeout(std::chrono::milliseconds timeout) { op_timeout_ = timeout; }

  // Aborts the NCCL communicator (idempotent); later calls throw.
  void abort();
  bool aborted() const { return aborted_; }

  // Waits until `event` on stream() completes, polling NCCL's async error; throws `what` on timeout.
  void wait_event(cudaEvent_t event, std::chrono::milliseconds timeout, const std::string& what);

 private:
  NcclCommunicator();
  void init(const void* id, std::chrono::milliseconds init_timeout);  // ncclCommInitRankConfig, non-blocking
  void check_state(const char* where);  // throws after an abort or an async error
  void read_rank_and_size(const std::string& what);  // from comm_
  // Non-blocking calls: wait until the call is queued (a first send/recv also connects to the peer,
  // which needs the peer); throws `what` after `timeout`.
  void wait_enqueued(const std::string& what, std::chrono::milliseconds timeout);
  void staged_all_reduce(void* host, size_t bytes, size_t count, ReduceOp op, int nccl_type);

  ncclComm* comm_ = nullptr;
  CudaStream stream_{StreamPriority::kHigh};
  cudaEvent_t done_ = nullptr;
  int rank_ = 0, size_ = 1;
  bool aborted_ = false;
  bool owned_ = true;
  std::chrono::milliseconds op_timeout_{std::chrono::seconds(120)};
};

}  // namespace ra
