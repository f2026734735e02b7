#include "python_communicator.h"

#include <nanobind/ndarray.h>

#include <string>

#include "runtime/error.h"

namespace ra::python {
namespace {

// A writable memoryview over `bytes` at `data`, valid while the call that made it runs.
nb::object bytes_view(const void* data, size_t bytes) {
  const size_t shape[1] = {bytes};
  return nb::cast(nb::ndarray<nb::memview, uint8_t, nb::ndim<1>>(const_cast<void*>(data), 1, shape, nb::handle()));
}

// "RuntimeError: Operation timed out!": the Python error's type and message, without its traceback.
std::string error_text(const nb::python_error& e) {
  return nb::cast<std::string>(e.type().attr("__name__")) + ": " + nb::cast<std::string>(nb::str(e.value()));
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "sum";
}

class PythonExchange final : public PendingExchange {
 public:
  PythonExchange(nb::object handle, int tag) : handle_(std::move(handle)), tag_(tag) {}
  ~PythonExchange() override {
    nb::gil_scoped_acquire held;
    handle_.reset();
  }
  void wait(std::chrono::milliseconds timeout) override {
    nb::gil_scoped_acquire held;
    try {
      handle_.attr("wait")(double(timeout.count()) / 1000.0);
    } catch (const nb::python_error& e) {
      RA_FAIL("ring step ", tag_, ": the communicator's exchange failed: ", error_text(e));
    }
  }

 private:
  nb::object handle_;
  int tag_;
};

}  // namespace

bool is_python_communicator(nb::handle comm) { return nb::hasattr(comm, "ring_shift"); }

PythonCommunicator::PythonCommunicator(nb::handle comm) {
  nb::gil_scoped_acquire held;
  comm_ = nb::borrow(comm);
  for (const char* name : {"rank", "size", "ring_shift", "all_reduce"})
    RA_CHECK(nb::hasattr(comm, name), "comm has no '", name, "': expected an mpi4py communicator or an object with ",
             "rank, size, ring_shift and all_reduce (see ringattn.torch)");
  rank_ = nb::cast<int>(comm.attr("rank"));
  size_ = nb::cast<int>(comm.attr("size"));
  RA_CHECK(size_ > 0 && rank_ >= 0 && rank_ < size_, "comm has rank ", rank_, " of size ", size_);
}

PythonCommunicator::~PythonCommunicator() {
  nb::gil_scoped_acquire held;
  comm_.reset();
}

std::unique_ptr<PendingExchange> PythonCommunicator::ring_shift(const void* send, void* recv, size_t bytes, int tag) {
  nb::gil_scoped_acquire held;
  return std::make_unique<PythonExchange>(comm_.attr("ring_shift")(bytes_view(send, bytes), bytes_view(recv, bytes), tag),
                                          tag);
}

void PythonCommunicator::reduce(void* data, size_t count, const char* dtype, ReduceOp op) {
  nb::gil_scoped_acquire held;
  try {
    comm_.attr("all_reduce")(bytes_view(data, count * 8), dtype, op_name(op));
  } catch (const nb::python_error& e) {
    RA_FAIL("the communicator's all_reduce (", count, " ", dtype, ") failed on rank ", rank_,
            " (did every rank call the ring?): ", error_text(e));
  }
}

void PythonCommunicator::all_reduce(double* data, size_t count, ReduceOp op) { reduce(data, count, "float64", op); }
void PythonCommunicator::all_reduce(int64_t* data, size_t count, ReduceOp op) { reduce(data, count, "int64", op); }

void PythonCommunicator::all_gather(const void*, void*, size_t) {
  RA_FAIL("the Python communicator has no all_gather (the ring does not use it)");
}
void PythonCommunicator::broadcast(void*, size_t, int) {
  RA_FAIL("the Python communicator has no broadcast (the ring does not use it)");
}
void PythonCommunicator::barrier() { RA_FAIL("the Python communicator has no barrier (the ring does not use it)"); }

}  // namespace ra::python
