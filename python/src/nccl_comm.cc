#include "nccl_comm.h"

#include <nanobind/stl/string.h>

#include <string>

#include "runtime/error.h"
#include "runtime/memory.h"

#if RA_HAVE_CUDA
#include "collectives/nccl_communicator.h"
#endif

namespace ra::python {
namespace {

using namespace nb::literals;

nb::bytes nccl_unique_id() {
#if RA_HAVE_CUDA
  const std::string id = NcclCommunicator::unique_id();
  return nb::bytes(id.data(), id.size());
#else
  RA_FAIL("nccl_unique_id: this build of ringattn has no CUDA back end");
#endif
}

void make_nccl_comm(NcclComm* self, nb::bytes unique_id, int rank, int size, int device, double timeout_s) {
#if RA_HAVE_CUDA
  RA_CHECK(timeout_s > 0, "timeout is ", timeout_s, " s, expected a positive number of seconds");
  const std::string id(unique_id.c_str(), unique_id.size());
  NcclCommunicator::check_arguments(id, rank, size);  // before anything touches a device, on every rank alike
  RA_CHECK(device >= 0, "device ", device, ": expected a CUDA device index");
  std::shared_ptr<Communicator> comm;
  {
    nb::gil_scoped_release released;  // set-up waits for every rank
    const ScopedCudaDevice on(device);  // the communicator's stream and NCCL's resources live on it
    comm = std::make_shared<NcclCommunicator>(id, rank, size, std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  }
  new (self) NcclComm{std::move(comm), device};
#else
  (void)self, (void)unique_id, (void)rank, (void)size, (void)device, (void)timeout_s;
  RA_FAIL("NcclComm: this build of ringattn has no CUDA back end");
#endif
}

}  // namespace

void bind_nccl_comm(nb::module_& m) {
  m.def("nccl_unique_id", &nccl_unique_id, "A new NCCL unique id (bytes) for NcclComm, made on one rank.");
  nb::class_<NcclComm>(m, "NcclComm",
                       "An NCCL communicator over `size` processes, each passing the same unique id and its own rank, "
                       "on CUDA device `device`: the GPU ring's communicator without MPI (under torchrun).")
      .def("__init__", &make_nccl_comm, "unique_id"_a, "rank"_a, "size"_a, "device"_a, "timeout"_a = 120.0)
      .def_prop_ro("rank", [](const NcclComm& c) { return c.comm->rank(); })
      .def_prop_ro("size", [](const NcclComm& c) { return c.comm->size(); })
      .def_prop_ro("device", [](const NcclComm& c) { return c.device; });
}

}  // namespace ra::python
