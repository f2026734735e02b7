// ringattn._core.NcclComm: an NCCL communicator made from a unique id that the caller carries to every
// rank itself (under torchrun, over torch.distributed), so that the GPU ring runs without MPI.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>

#include "collectives/communicator.h"

namespace ra::python {

namespace nb = nanobind;

struct NcclComm {
  std::shared_ptr<Communicator> comm;  // an NcclCommunicator; shared with the rings kept over it
  int device = 0;                      // the CUDA device it was made on
};

void bind_nccl_comm(nb::module_& m);

}  // namespace ra::python
