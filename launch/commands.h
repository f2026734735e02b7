// The ringattn subcommands. Each returns the process exit code; errors are thrown as ra::Error.
#pragma once

#include <initializer_list>
#include <memory>

#include "attention/ring/ring.h"
#include "collectives/mpi_communicator.h"
#include "collectives/mpi_session.h"
#include "launch/cli_options.h"
#include "mesh/device_mesh.h"

#if RA_HAVE_CUDA
#include "collectives/nccl_communicator.h"
#include "runtime/cuda_device.h"
#endif

namespace ra::cli {

enum ExitCode : int { kOk = 0, kWrongResults = 1, kBadInput = 2, kRuntimeFailure = 3 };

int cmd_generate(int argc, char** argv, const MpiSession& mpi);
int cmd_run(int argc, char** argv, const MpiSession& mpi);
int cmd_verify(int argc, char** argv, const MpiSession& mpi);
int cmd_bench(int argc, char** argv, const MpiSession& mpi);

// The world, the mesh over it and the sequence axis (a ring of one when the mesh has no sp axis).
// With --backend cuda: one GPU per rank (local rank modulo the GPUs of the node), a compute stream,
// and an NCCL communicator for the sequence axis: the job's (bootstrapped over MPI) or split from it.
struct Job {
  // `args`: the command line after the subcommand; every rank must have been started with the same.
  Job(const AttentionOptions& opts, const MpiSession& mpi, const std::string& args);
  Communicator& sequence_axis() const;
  // A mesh axis over MPI (host memory), or this rank alone where the mesh has no such axis.
  Communicator& host_axis(const char* name) const;
  MemoryKind memory() const { return on_device ? MemoryKind::kCuda : MemoryKind::kHost; }
  void* stream() const;    // the compute stream (a cudaStream_t), nullptr on the host
  void synchronize() const;  // waits for the compute stream
  MpiCommunicator world{MPI_COMM_WORLD};
  MeshShape shape;
  std::unique_ptr<DeviceMesh> mesh;
  mutable SelfCommunicator self;
  bool on_device = false;
  bool shares_gpus = false;  // more ranks than GPUs on some node: no NCCL, the GPU ring over MPI + copy engines
#if RA_HAVE_CUDA
  std::unique_ptr<CudaStream> compute;
  std::unique_ptr<NcclCommunicator> nccl_world;     // every rank of the job
  std::unique_ptr<NcclCommunicator> nccl_sequence;  // split from it when the mesh has other axes too
#endif
};

// dbias (host) summed over the ranks of each named mesh axis ("dp", "tp", "sp") that splits a dimension
// the bias (B|1, H|1, T|1, S) broadcasts (0, 1, 2): those ranks share its entries.
void sum_shared_bias_gradient(Tensor& dbias, const Shape& bias_shape, const Job& job,
                              std::initializer_list<const char*> axes);
void sum_shared_bias_gradient(std::vector<double>& dbias, const Shape& bias_shape, const Job& job,
                              std::initializer_list<const char*> axes);

// A host tensor (or f64 values) summed over the ranks of each named mesh axis the job has (those that
// share its entries, e.g. dsinks over "dp" and "sp").
void sum_over_mesh_axes(Tensor& t, const Job& job, std::initializer_list<const char*> axes);
void sum_over_mesh_axes(std::vector<double>& values, const Job& job, std::initializer_list<const char*> axes);

struct ShardPlan;
// dK / dV (host f32 tensors, or f64 values) summed over the tp ranks that hold the same kv heads
// (ShardPlan::kv_head_sharers > 1; else unchanged), in f64.
void sum_shared_kv_heads(Tensor& t, const ShardPlan& plan, const Job& job);
void sum_shared_kv_heads(std::vector<double>& values, const ShardPlan& plan, const Job& job);

// The command line after the program name, for the agreement check.
std::string args_text(int argc, char** argv);

// The implementation the options name, with the ring context filled in for `ring`.
std::unique_ptr<AttentionImpl> make_impl(const AttentionOptions& opts, const Job& job, int64_t q_len, int64_t kv_len,
                                         RingContext& ctx);

}  // namespace ra::cli
