// The MPI back end of Communicator over host memory. It duplicates the communicator it is given
// (and frees its copy), so ringattn's traffic never mixes with the caller's; errors return codes.
#pragma once

#include <mpi.h>

#include "collectives/communicator.h"
#include "runtime/fault_injection.h"

namespace ra {

// MPI_Allreduce of int64 values over `comm` that throws ra::Error naming `what` once `timeout` has passed
// without every rank joining. A collective cannot be cancelled: one that timed out stays pending on `comm`
// (its buffer kept), which is then fit only to be freed, as after a failed ring step.
void mpi_all_reduce_within(MPI_Comm comm, int64_t* data, size_t count, ReduceOp op, std::chrono::milliseconds timeout,
                           const char* what);

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }

  // Non-blocking Isend / Irecv, progressed by a helper thread that polls them against the deadline
  // so that the transfer moves while the caller computes.
  std::unique_ptr<PendingExchange> ring_shift(const void* send, void* recv, size_t bytes, int tag) override;
  void all_reduce(double* data, size_t count, ReduceOp op) override;
  void all_reduce(int64_t* data, size_t count, ReduceOp op) override;
  void all_reduce_within(int64_t* data, size_t count, ReduceOp op, std::chrono::milliseconds timeout,
                         const char* what) override;
  void all_gather(const void* send, void* recv, size_t bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;

  // A communicator over the ranks that share `color`, ordered by `key`.
  std::unique_ptr<MpiCommunicator> split(int color, int key) const;

  // The failure tests' plan (RINGATTN_FAULT=short shortens one send); none unless set.
  void set_fault_plan(const FaultPlan& plan) { fault_ = plan; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool threaded_progress_ = false;
  FaultPlan fault_;
};

}  // namespace ra
