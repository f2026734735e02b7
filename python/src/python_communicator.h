// A Communicator whose messages go through a Python object: the ring under launchers that bring their
// own communication (torch.distributed under torchrun, say) instead of MPI. The object provides
//   rank, size                                  ints
//   ring_shift(send, recv, tag) -> handle       send to rank + 1, receive from rank - 1, both at once;
//   handle.wait(timeout_seconds)                returns once both are done, raises past the timeout
//   all_reduce(values, dtype, op)               in place; dtype "float64" | "int64", op "sum" | "max" | "min"
// where send, recv and values are writable memoryviews of bytes. Calls take the interpreter's lock.
#pragma once

#include <nanobind/nanobind.h>

#include "collectives/communicator.h"

namespace ra::python {

namespace nb = nanobind;

class PythonCommunicator final : public Communicator {
 public:
  // `comm` is checked here: it must have the methods above. Takes the interpreter's lock itself.
  explicit PythonCommunicator(nb::handle comm);
  ~PythonCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "python"; }
  std::unique_ptr<PendingExchange> ring_shift(const void* send, void* recv, size_t bytes, int tag) override;
  void all_reduce(double* data, size_t count, ReduceOp op) override;
  void all_reduce(int64_t* data, size_t count, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;

 private:
  void reduce(void* data, size_t count, const char* dtype, ReduceOp op);
  nb::object comm_;
  int rank_ = 0, size_ = 1;
};

// Whether `comm` looks like such an object (has ring_shift), as opposed to an mpi4py communicator.
bool is_python_communicator(nb::handle comm);

}  // namespace ra::python
