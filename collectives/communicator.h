// The Communicator interface: the few collectives ring attention needs, over host memory (MPI) or
// device memory (NCCL). A back end is chosen at construction; callers see only this.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ra {

enum class ReduceOp : uint8_t { kSum, kMax, kMin };

// An exchange in flight. wait() returns when it is done, or throws ra::Error naming the peers once
// `timeout` has passed (the caller then aborts the job: a half-done exchange cannot be cancelled).
class PendingExchange {
 public:
  virtual ~PendingExchange() = default;
  virtual void wait(std::chrono::milliseconds timeout) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;
  // Whether ring_shift and the collectives take device pointers (NCCL); MPI and self take host memory.
  virtual bool carries_device_memory() const { return false; }

  // Sends `bytes` from `send` to rank + 1 and receives `bytes` into `recv` from rank - 1 (mod size),
  // both at once and without blocking; `tag` labels the step in error messages.
  virtual std::unique_ptr<PendingExchange> ring_shift(const void* send, void* recv, size_t bytes, int tag) = 0;
  virtual void all_reduce(double* data, size_t count, ReduceOp op) = 0;
  virtual void all_reduce(int64_t* data, size_t count, ReduceOp op) = 0;
  // The same, giving up after `timeout` with an ra::Error naming `what` where a rank has not joined: MPI's
  // collectives wait forever otherwise (NCCL's and a Python object's bound every call of their own).
  virtual void all_reduce_within(int64_t* data, size_t count, ReduceOp op, std::chrono::milliseconds timeout,
                                 const char* what) {
    all_reduce(data, count, op);
  }
  virtual void all_gather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  int next() const { return (rank() + 1) % size(); }
  int previous() const { return (rank() + size() - 1) % size(); }
};

// Host floats summed over the communicator's ranks in f64 (one rounding back to f32 per value).
void all_reduce_sum_f64(Communicator& comm, float* data, size_t count);

// Collective: whether any rank of `comm` has a local rank (its place among the ranks of its node) at or
// past `devices`, the GPUs its node has: ranks then share GPUs (one GPU per rank is local rank % devices).
bool ranks_share_devices(Communicator& comm, int local_rank, int devices);

// The single-process communicator: a ring of one, every collective the identity.
class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend_name() const override { return "self"; }
  std::unique_ptr<PendingExchange> ring_shift(const void* send, void* recv, size_t bytes, int tag) override;
  void all_reduce(double*, size_t, ReduceOp) override {}
  void all_reduce(int64_t*, size_t, ReduceOp) override {}
  void all_gather(const void* send, void* recv, size_t bytes_per_rank) override;
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
};

}  // namespace ra
