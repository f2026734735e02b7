// `ringattn run`: read this rank's slices, run the chosen implementation, write o and lse.
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "attention/invariants.h"
#include "attention/validate.h"
#include "launch/commands.h"
#include "launch/sharded_io.h"
#include "launch/watchdog.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra::cli {
namespace {

// NaN / Inf in the inputs: counted on every rank, summed, reported per dataset; an error unless
// --allow-nonfinite.
void check_finite_inputs(const LocalTensors& local, const std::string& input, bool allow, Job& job) {
  const std::pair<const Tensor*, const char*> datasets[] = {{&local.q, "q"}, {&local.k, "k"}, {&local.v, "v"}, {&local.bias, "bias"}};
  int64_t counts[4];
  for (int i = 0; i < 4; ++i) counts[i] = count_nonfinite(datasets[i].first->view());
  job.world.all_reduce(counts, 4, ReduceOp::kSum);
  for (int i = 0; i < 4; ++i) {
    if (counts[i] == 0) continue;
    RA_CHECK(allow, "input '", input, "' dataset '", datasets[i].second, "' holds ", counts[i],
             " NaN or Inf values (summed over the ranks' slices); pass --allow-nonfinite to run anyway");
    if (job.world.rank() == 0)
      std::fprintf(stderr, "ringattn run: warning: dataset '%s' holds %ld NaN or Inf values (--allow-nonfinite)\n",
                   datasets[i].second, long(counts[i]));
  }
}

// The output must be creatable: its directory exists and is writable, and it is not there already
// (unless --overwrite). Every rank checks the same path, so every rank fails alike.
void check_output_path(const std::string& output, bool overwrite) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::absolute(output).parent_path();
  RA_CHECK(fs::is_directory(dir), "output '", output, "': directory '", dir.string(), "' does not exist");
  RA_CHECK(::access(dir.c_str(), W_OK) == 0, "output '", output, "': directory '", dir.string(), "' is not writable");
  RA_CHECK(overwrite || !fs::exists(output), "output '", output, "' exists; refusing to replace it (pass --overwrite)");
}

// A full disk found before the compute rather than in the middle of the collective write: the free
// space of the output's filesystem and the process's file-size limit must hold the file.
void check_output_space(const std::string& output, uint64_t bytes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::absolute(output).parent_path();
  struct statvfs fs_info {};
  if (::statvfs(dir.c_str(), &fs_info) == 0) {
    const uint64_t free_bytes = uint64_t(fs_info.f_bavail) * fs_info.f_frsize;
    RA_CHECK(free_bytes >= bytes, "output '", output, "' needs about ", bytes, " bytes but the filesystem of '",
             dir.string(), "' has ", free_bytes, " bytes free (pass --no-space-check to try anyway)");
  }
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    RA_CHECK(uint64_t(limit.rlim_cur) >= bytes, "output '", output, "' needs about ", bytes,
             " bytes but this process may write files of at most ", uint64_t(limit.rlim_cur),
             " bytes (ulimit -f; pass --no-space-check to try anyway)");
}

}  // namespace

int cmd_run(int argc, char** argv, const MpiSession& mpi) {
  AttentionOptions opts;
  std::string input, output;
  bool overwrite = false, no_space_check = false, pageable = false;
  int64_t io_timeout_s = 600;
  po::options_description desc("ringattn run");
  desc.add_options()("help", "this text")
    ("input", po::value(&input)->required(), "HDF5 file with q, k, v (and optional mask, bias, segment_ids)")
    ("output", po::value(&output)->required(), "HDF5 file to write o and lse to")
    ("overwrite", po::bool_switch(&overwrite), "replace an existing output file")
    ("no-space-check", po::bool_switch(&no_space_check), "skip the free-space and file-size-limit check of the output")
    ("pageable", po::bool_switch(&pageable), "with --backend cuda: stage inputs and outputs in pageable host memory "
     "instead of pinned (page-locked) buffers")
    ("io-timeout", po::value(&io_timeout_s)->default_value(600), "seconds reading, checking or writing may take before the job is aborted");
  add_attention_options(desc, opts);
  if (!parse(argc, argv, desc, "Usage: mpirun -np N ringattn run --input F --output G [options]")) return kOk;
  const AttentionParams params = to_params(opts);
  Job job(opts, mpi, args_text(argc, argv));
  const int rank = job.world.rank();
  // Phases without a deadline of their own get one: the ring's per-step timeout times (steps + 2)
  // for the attention, and --io-timeout for reading, checking and writing.
  Watchdog watchdog(rank);
  watchdog.phase("reading the inputs", std::chrono::seconds(io_timeout_s));
  check_output_path(output, overwrite);  // before hours of compute, not after

  H5File file(input, H5File::Mode::kRead, job.world.comm());
  ShardPlan plan = plan_shards(file, job.shape, rank, chosen_layout(opts));
  if (!no_space_check) {
    const uint64_t rows = uint64_t(plan.batch) * uint64_t(plan.q_len) * uint64_t(plan.q_heads);
    check_output_space(output, rows * (uint64_t(plan.v_head_dim) * dtype_size(plan.dtype) + 4) + (1u << 20));
  }
  RingContext ctx;
  auto impl = make_impl(opts, job, plan.q_len, plan.kv_len, ctx);
  const TokenPositions pos = impl->name() == "ring" ? ring_positions(ctx) : TokenPositions::dense(plan.q_len, plan.kv_len);
  // Times of the slowest rank: [0] reading, [1] to the device, [2] the attention, [3] back to the host.
  double seconds[4] = {0, 0, 0, 0};
  auto lap = [last = std::chrono::steady_clock::now()]() mutable {  // seconds since the previous lap
    const auto now = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(now - std::exchange(last, now)).count();
  };
  // On GPUs, HDF5 reads into page-locked buffers, from which the copies to the device are plain DMA.
  const MemoryKind staging = job.on_device && !pageable ? MemoryKind::kPinned : MemoryKind::kHost;
  LocalTensors local = read_local(file, plan, false, staging);
  seconds[0] = lap();
  const AttentionInputs in = local.inputs();
  validate_attention(in, params, pos, impl->max_head_dim());  // before the first exchange
  check_finite_inputs(local, input, opts.allow_nonfinite, job);
  job.world.barrier();

  // The cuda backend copies the slices to the device, and O and LSE back to the same kind of host
  // memory for the collective write.
  watchdog.phase("the attention", std::chrono::seconds(opts.timeout_s * (job.sequence_axis().size() + 2)));
  lap();  // the checks above are not staging
  const InputsCopy staged = job.on_device ? copy_inputs(in, MemoryKind::kCuda) : InputsCopy{};
  seconds[1] = lap();
  AttentionOutput out = impl->forward(job.on_device ? staged.inputs : in, params, pos);
  job.synchronize();
  seconds[2] = lap();
  if (job.on_device) out = AttentionOutput{to_memory(out.o, staging), to_memory(out.lse, staging)};
  seconds[3] = lap();
  job.world.all_reduce(seconds, 4, ReduceOp::kMax);

  watchdog.phase("checking and writing the outputs", std::chrono::seconds(io_timeout_s));
  check_output_invariants(in, params, out.o, out.lse, job.sequence_axis());
  const std::map<std::string, std::string> attributes{
      {"impl", std::string(impl->name())}, {"local_impl", opts.local_impl}, {"backend", opts.backend},
      {"mesh", job.shape.str()}, {"layout", layout_name(ctx.layout)}, {"params", params.describe()},
      {"input", input}, {"dtype", std::string(dtype_name(plan.dtype))}};
  write_outputs(output, plan, out.o, out.lse, attributes, job.world.comm(), overwrite);
  watchdog.disarm();
  if (rank == 0) {
    double flops = 4.0 * plan.batch * plan.q_heads * double(plan.q_len) * double(plan.kv_len) * plan.head_dim;
    if (params.causal) flops /= 2;
    std::printf("ringattn run: %s (%s) on mesh %s, layout %s: B=%ld T=%ld S=%ld Hq=%ld Hkv=%ld D=%ld %s, %.3f s, "
                "%.2f GFLOP/s total -> %s\n",
                std::string(impl->name()).c_str(), opts.backend.c_str(), job.shape.str().c_str(), layout_name(ctx.layout),
                long(plan.batch), long(plan.q_len), long(plan.kv_len), long(plan.q_heads), long(plan.kv_heads),
                long(plan.head_dim), std::string(dtype_name(plan.dtype)).c_str(), seconds[2], flops / seconds[2] * 1e-9,
                output.c_str());
    std::printf("ringattn run: reading %.3f s", seconds[0]);
    if (job.on_device)
      std::printf(", %s host -> device %.3f s, device -> host %.3f s", pageable ? "pageable" : "pinned", seconds[1],
                  seconds[3]);
    std::printf("\n");
  }
  return kOk;
}

}  // namespace ra::cli
