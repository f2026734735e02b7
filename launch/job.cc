// Job setup shared by run, verify and bench.
#include <algorithm>
#include <cstdio>
#include <string_view>
#include <vector>

#include "attention/registry.h"
#include "launch/commands.h"
#include "launch/sharded_io.h"
#include "runtime/checksum.h"
#include "runtime/error.h"

namespace ra::cli {

// `world` is declared before `shape`, so it exists here.
std::string args_text(int argc, char** argv) {
  std::string text;
  for (int i = 0; i < argc; ++i) text += std::string(i ? " " : "") + argv[i];
  return text;
}

namespace {

// Every rank compares the CRC of its command line with every other's, before any other exchange, so
// a job whose ranks were started differently stops with the same message everywhere.
void check_same_options(MpiCommunicator& world, const std::string& args) {
  const uint32_t mine = crc32_bytes(args.data(), args.size());
  std::vector<uint32_t> all(size_t(world.size()));
  world.all_gather(&mine, all.data(), sizeof(mine));
  std::string differing;
  for (int r = 0; r < world.size(); ++r)
    if (all[size_t(r)] != all[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  RA_CHECK(differing.empty(), "the ranks were started with different options: rank(s) ", differing,
           " differ from rank 0 (this is rank ", world.rank(), ": '", args, "'); start every rank with the same command");
}

}  // namespace

Job::Job(const AttentionOptions& opts, const MpiSession& mpi, const std::string& args)
    : shape(MeshShape::parse(mesh_text(opts, world.size()))) {
  check_same_options(world, args);
  RA_CHECK(shape.size() == world.size(), "--mesh ", shape.str(), " has ", shape.size(), " ranks but the job has ",
           world.size(), " (mpirun -np ", world.size(), ")");
  mesh = std::make_unique<DeviceMesh>(shape, world);
  on_device = parse_backend(opts.backend) == Backend::kCuda;
  if (!on_device) return;
#if RA_HAVE_CUDA
  cuda_select_device(mpi.local_rank());
  const int devices = cuda_device_count();
  compute = std::make_unique<CudaStream>();
  // More ranks than GPUs on a node: ranks share GPUs, which NCCL refuses; the ring then runs over MPI
  // with copy engines (correct, time-sliced: for trying a job on a workstation, not for speed).
  shares_gpus = ranks_share_devices(world, mpi.local_rank(), devices);
  if (shares_gpus && shape.has_axis("sp")) {
    RA_CHECK(opts.ring_transport != "nccl", "--ring-transport nccl: ranks share GPUs here (", devices,
             " GPU(s) for rank ", mpi.local_rank(), " of this node; NCCL needs a GPU per rank): use --ring-transport "
             "auto or copy-engines, or one rank per GPU");
    if (world.rank() == 0)
      std::fprintf(stderr, "ringattn: note: more ranks than GPUs on a node: the ring runs over copy engines between "
                   "ranks that share GPUs (time-sliced: for trying a job, not for speed)\n");
    return;
  }
  if (shape.has_axis("sp")) {
    // One unique-id bootstrap for the job; an axis of a larger mesh is split from it (ncclCommSplit).
    nccl_world = std::make_unique<NcclCommunicator>(world);
    const int sp = shape.axis_index("sp");
    if (shape.axis_size(sp) == world.size()) return;
    const MeshShape::AxisGroup group = shape.axis_group(world.rank(), sp);
    nccl_sequence = nccl_world->split(group.color, group.key, "mesh axis 'sp' of " + shape.str());
  }
#else
  RA_FAIL("--backend cuda: this build of ringattn has no CUDA back end (configure with -DRA_ENABLE_CUDA=ON where nvcc is)");
#endif
}

Communicator& Job::sequence_axis() const {
#if RA_HAVE_CUDA
  if (nccl_sequence) return *nccl_sequence;
  if (nccl_world) return *nccl_world;  // the sequence axis is the whole job
#endif
  return host_axis("sp");
}

Communicator& Job::host_axis(const char* name) const { return shape.has_axis(name) ? mesh->axis(name) : self; }

namespace {

// Whether the bias (B|1, H|1, T|1, S) broadcasts the dimension the mesh axis splits (dp: 0, tp: 1, sp: 2).
bool bias_broadcasts_over(const char* axis, const Shape& bias_shape) {
  const int dim = std::string_view(axis) == "dp" ? 0 : std::string_view(axis) == "tp" ? 1 : 2;
  return pairwise_shape(bias_shape)[dim] == 1;
}

}  // namespace

void sum_over_mesh_axes(Tensor& t, const Job& job, std::initializer_list<const char*> axes) {
  for (const char* axis : axes)
    if (job.shape.has_axis(axis) && job.host_axis(axis).size() > 1)
      all_reduce_sum_f64(job.host_axis(axis), t.data<float>(), size_t(t.numel()));
}

void sum_over_mesh_axes(std::vector<double>& values, const Job& job, std::initializer_list<const char*> axes) {
  for (const char* axis : axes)
    if (job.shape.has_axis(axis) && job.host_axis(axis).size() > 1)
      job.host_axis(axis).all_reduce(values.data(), values.size(), ReduceOp::kSum);
}

void sum_shared_bias_gradient(std::vector<double>& dbias, const Shape& bias_shape, const Job& job,
                              std::initializer_list<const char*> axes) {
  for (const char* axis : axes)
    if (bias_broadcasts_over(axis, bias_shape)) sum_over_mesh_axes(dbias, job, {axis});
}

void sum_shared_bias_gradient(Tensor& dbias, const Shape& bias_shape, const Job& job,
                              std::initializer_list<const char*> axes) {
  for (const char* axis : axes)
    if (bias_broadcasts_over(axis, bias_shape)) sum_over_mesh_axes(dbias, job, {axis});
}

void sum_shared_kv_heads(std::vector<double>& values, const ShardPlan& plan, const Job& job) {
  if (plan.kv_head_sharers == 1) return;
  // Each rank's part in its kv head's slot of a buffer over every kv head, summed over the tp axis (whose
  // ranks hold every kv head), then its slot's sums taken back.
  const size_t n = values.size();
  std::vector<double> slots(n * size_t(plan.kv_heads), 0.0);
  std::copy(values.begin(), values.end(), slots.begin() + std::ptrdiff_t(n * size_t(plan.hkv_offset)));
  job.host_axis("tp").all_reduce(slots.data(), slots.size(), ReduceOp::kSum);
  std::copy_n(slots.begin() + std::ptrdiff_t(n * size_t(plan.hkv_offset)), n, values.begin());
}

void sum_shared_kv_heads(Tensor& t, const ShardPlan& plan, const Job& job) {
  if (plan.kv_head_sharers == 1) return;
  RA_CHECK(t.dtype() == DType::kF32 && t.view().is_contiguous(), "sum_shared_kv_heads takes contiguous f32 tensors");
  float* data = t.data<float>();
  std::vector<double> values(data, data + t.numel());
  sum_shared_kv_heads(values, plan, job);
  std::copy(values.begin(), values.end(), data);
}

void* Job::stream() const {
#if RA_HAVE_CUDA
  if (compute) return compute->get();
#endif
  return nullptr;
}

void Job::synchronize() const {
#if RA_HAVE_CUDA
  if (compute) compute->synchronize();
#endif
}

std::unique_ptr<AttentionImpl> make_impl(const AttentionOptions& opts, const Job& job, int64_t q_len, int64_t kv_len,
                                         RingContext& ctx) {
  const AttentionRegistry& registry = AttentionRegistry::builtin();
  const std::string name = registry.canonical_name(opts.impl);
  ctx.comm = &job.sequence_axis();
  ctx.layout = chosen_layout(opts);
  ctx.global_q_len = q_len;
  ctx.global_kv_len = kv_len;
  ctx.local_impl = opts.local_impl;
  ctx.step_timeout = std::chrono::seconds(opts.timeout_s);
  ctx.verify_blocks = !opts.no_block_checksums;
  ctx.deterministic = opts.deterministic;
  ctx.transport = parse_ring_transport(opts.ring_transport);
  if (job.shape.has_axis("sp")) ctx.host_comm = dynamic_cast<MpiCommunicator*>(&job.mesh->axis("sp"));
  // The failure tests drive the CLI's ring through the environment; a library's ring has no plan.
  ctx.fault = FaultPlan::from_environment();
  if (ctx.host_comm) ctx.host_comm->set_fault_plan(ctx.fault);
  RA_CHECK(!opts.deterministic || name == "ring" || parse_backend(opts.backend) == Backend::kCuda, "--deterministic "
           "on the host applies to --impl ring (use --impl ring on one rank for the same bits as on N ranks), not "
           "--impl ", name);
  RA_CHECK(name == "ring" || ctx.comm->size() == 1, "--impl ", name, " runs on one rank's whole sequence; the mesh's sp axis has ",
           ctx.comm->size(), " ranks: use --impl ring (or a mesh without sp)");
  std::unique_ptr<AttentionImpl> impl = registry.create(name, parse_backend(opts.backend), &ctx);
  check_flash_kernel_choice(*impl, to_params(opts));
  impl->set_cuda_stream(job.stream());
  return impl;
}

}  // namespace ra::cli
