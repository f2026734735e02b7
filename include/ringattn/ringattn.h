// ringattn's public C++ API in one include. Link `ringattn::ringattn` (CMake) or `pkg-config ringattn`.
//
//   ra::Tensor / ra::TensorView  - owning tensors and views of caller-owned host, pinned or device memory
//   ra::MpiCommunicator          - wraps (duplicates) the caller's MPI communicator
//   ra::NcclCommunicator         - NCCL over an MPI bootstrap, or adopting the caller's ncclComm_t;
//                                  split() gives a mesh axis its own communicator (ncclCommSplit)
//   ra::DeviceMesh, ra::MeshShape, ra::PartitionSpec, ra::NamedSharding, sequence layouts
//   ra::AttentionRegistry        - implementations by name: sdpa, flash_attn2, blockwise, ring
//   ra::AttentionImpl            - forward (O and LSE), accumulate into an f32 carry, set_cuda_stream;
//                                  backward (dQ, dK, dV, dBias, dSinks), accumulate_backward per K/V block
//   ra::RingContext              - what `ring` needs: communicator, layout, global lengths, local kernel
//
// No hidden global state: MPI is initialised by the caller (or ra::MpiSession), every communicator
// and registry is a value the caller owns, and device work goes to the stream the caller sets.
#pragma once

#include "attention/attention_impl.h"
#include "attention/backward.h"
#include "attention/carry.h"
#include "attention/inputs.h"
#include "attention/params.h"
#include "attention/registry.h"
#include "attention/ring/ring.h"
#include "attention/cpu/sdpa_cpu.h"
#include "attention/tolerance.h"
#include "attention/validate.h"
#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"
#include "collectives/mpi_session.h"
#include "mesh/device_mesh.h"
#include "mesh/mesh_shape.h"
#include "mesh/sequence_layout.h"
#include "mesh/sharding.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "runtime/random.h"
#include "runtime/tensor.h"

#if RA_HAVE_CUDA
#include "collectives/nccl_communicator.h"
#include "runtime/cuda_device.h"
#endif
