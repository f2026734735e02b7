// The command line of the MPI ring tests: --backend=cuda (the GPU ring's cases) and --transport=, and the
// GPU set-up they need: a device per rank (local rank modulo the node's GPUs), and whether ranks share
// GPUs (then the ring runs over MPI and copy engines: NCCL refuses a shared GPU).
#pragma once

#include <cstdio>
#include <string>

#include "attention/ring/ring.h"
#include "collectives/mpi_communicator.h"
#if RA_HAVE_CUDA
#include "runtime/cuda_device.h"
#endif

namespace ra::test {

struct RingTestArgs {
  bool cuda = false;
  RingTransport transport = RingTransport::kAuto;
  bool shared_gpus = false;
  // 77 (CTest's skip) where --backend=cuda has no GPU, or NCCL is asked of ranks sharing one; else 0.
  int skip_code = 0;
};

inline RingTestArgs parse_ring_test_args(int argc, char** argv, MpiCommunicator& world, int local_rank,
                                         const char* test) {
  RingTestArgs args;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--backend=cuda") args.cuda = true;
    else if (std::string(argv[i]).rfind("--transport=", 0) == 0)
      args.transport = parse_ring_transport(std::string(argv[i]).substr(12));
  if (!args.cuda) return args;
#if RA_HAVE_CUDA
  if (cuda_device_count() == 0) {
    if (world.rank() == 0) std::printf("%s --backend=cuda: no CUDA device, skipped\n", test);
    args.skip_code = 77;
    return args;
  }
  cuda_select_device(local_rank);
  args.shared_gpus = ranks_share_devices(world, local_rank, cuda_device_count());
  if (args.shared_gpus && args.transport == RingTransport::kNccl) {
    if (world.rank() == 0) std::printf("%s --transport=nccl: more ranks than GPUs (NCCL needs one each), skipped\n", test);
    args.skip_code = 77;
  } else if (args.shared_gpus && world.rank() == 0) {
    std::printf("%s: more ranks than GPUs: the GPU ring over MPI and copy engines\n", test);
  }
#else
  args.skip_code = 77;
#endif
  return args;
}

}  // namespace ra::test
