// `ringattn run`: read this rank's slices, run the chosen implementation, write o and lse (and, with
// --backward, dq, dk, dv and dbias from the input's dO).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <utility>

#include "attention/backward.h"
#include "attention/invariants.h"
#include "attention/validate.h"
#include "attention/registry.h"
#include "attention/ring/ring.h"
#include "launch/commands.h"
#include "launch/option_scope.h"
#include "launch/output_path.h"
#include "launch/sharded_io.h"
#include "launch/watchdog.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra::cli {
namespace {

// NaN / Inf in the inputs: counted on every rank, summed, reported per dataset; an error unless
// --allow-nonfinite. Returns the total. A part several ranks hold is counted by the first of them.
int64_t check_finite_inputs(const LocalTensors& local, const ShardPlan& plan, const H5File& file,
                            const std::string& input, bool allow, Job& job) {
  const DatasetNames& names = plan.names;
  const bool counts_here[] = {true, first_holder_of_kv_heads(plan), first_holder_of_kv_heads(plan),
                              !local.bias.defined() || first_holder_of_pairwise(plan, file.info(names.bias).shape),
                              first_holder_of_heads(plan)};
  const std::pair<const Tensor*, const std::string*> datasets[] = {{&local.q, &names.q},
                                                                    {&local.k, &names.k},
                                                                    {&local.v, &names.v},
                                                                    {&local.bias, &names.bias},
                                                                    {&local.sinks, &names.sinks}};
  constexpr int kCount = 5;
  int64_t counts[kCount], all = 0;
  // A bias's -inf hides its pair, as a float attn_mask's, and a sink of -inf is no sink (its head's rows as without
  // one): not counted.
  const auto is_bias = [&](int i) { return datasets[i].first == &local.bias; };
  const auto is_sinks = [&](int i) { return datasets[i].first == &local.sinks; };
  for (int i = 0; i < kCount; ++i)
    counts[i] = counts_here[i] ? count_nonfinite(datasets[i].first->view(),
                                                 /*minus_infinity_hides=*/is_bias(i) || is_sinks(i))
                               : 0;
  job.world.all_reduce(counts, kCount, ReduceOp::kSum);
  for (int i = 0; i < kCount; ++i) {
    if (counts[i] == 0) continue;
    all += counts[i];
    const char* what = is_bias(i)    ? "NaN or +Inf values (-inf, which hides its pair, is taken)"
                       : is_sinks(i) ? "NaN or +Inf values (-inf, which is no sink, is taken)"
                                     : "NaN or Inf values";
    RA_CHECK(allow, "input '", input, "' dataset '", *datasets[i].second, "' holds ", counts[i], " ", what,
             "; pass --allow-nonfinite to run anyway");
    if (job.world.rank() == 0)
      std::fprintf(stderr, "ringattn run: warning: dataset '%s' holds %ld %s (--allow-nonfinite)\n",
                   datasets[i].second->c_str(), long(counts[i]), what);
  }
  return all;
}

// With non-finite inputs (--allow-nonfinite) the outputs follow them: written, and counted here.
void report_nonfinite_outputs(const AttentionOutput& out, Job& job) {
  int64_t counts[2] = {count_nonfinite(out.o.view()), 0};
  for (int64_t i = 0; i < out.lse.numel(); ++i) counts[1] += std::isnan(out.lse.data<float>()[i]) || out.lse.data<float>()[i] == INFINITY;
  job.world.all_reduce(counts, 2, ReduceOp::kSum);
  if (job.world.rank() == 0)
    std::fprintf(stderr, "ringattn run: warning: the output holds %ld NaN or Inf values in o and %ld in lse, from the "
                 "non-finite inputs (--allow-nonfinite); the range check of the outputs was skipped\n",
                 long(counts[0]), long(counts[1]));
}

#if RA_HAVE_CUDA
// What this rank holds on its GPU besides the inputs: O, LSE, the f32 carry and the ring's two blocks.
std::vector<MemoryNeed> device_working_set(const ShardPlan& p, int ranks) {
  const uint64_t rows = uint64_t(p.b_count) * uint64_t(p.local_q()) * uint64_t(p.hq_count);
  const uint64_t block = uint64_t(p.b_count) * uint64_t(layout_max_rows(p.layout, p.kv_len, p.sp_size)) *
                         uint64_t(p.hkv_count) * uint64_t(p.head_dim + p.v_head_dim) * dtype_size(p.dtype);
  std::vector<MemoryNeed> needs = {{"o", rows * uint64_t(p.v_head_dim) * dtype_size(p.dtype)},
                                   {"lse", rows * 4},
                                   {"f32 carry", rows * uint64_t(p.v_head_dim + 2) * 4}};
  if (ranks > 1) needs.push_back({"two K/V block buffers", 2 * block});
  return needs;
}
#endif

}  // namespace

int cmd_run(int argc, char** argv, const MpiSession& mpi) {
  AttentionOptions opts;
  DatasetOptions datasets;
  std::string input, output;
  bool overwrite = false, no_space_check = false, pageable = false, quiet = false, backward = false,
       f32_gradients = false;
  std::string do_dataset = "do", dlse_dataset = kLseGradientDataset, grad_wire = "f32";
  int64_t io_timeout_s = 600;
  po::options_description desc("ringattn run");
  desc.add_options()("help", "this text")
    ("input", po::value(&input)->required(), "HDF5 file with q, k, v (and optional mask, bias, sinks, segment_ids or cu_seqlens)")
    ("output", po::value(&output)->required(), "HDF5 file to write o and lse to")
    ("overwrite", po::bool_switch(&overwrite), "replace an existing output file (never the input, never a non-regular file)")
    ("no-space-check", po::bool_switch(&no_space_check), "skip the free-space and file-size-limit check of the output")
    ("pageable", po::bool_switch(&pageable), "with --backend cuda: stage inputs and outputs in pageable host memory "
     "instead of pinned (page-locked) buffers")
    ("quiet", po::bool_switch(&quiet), "no progress lines on stderr")
    ("backward", po::bool_switch(&backward), "also compute dq, dk, dv (and dbias, dsinks) from dO and write them beside o and "
     "lse, in global token order whatever the layout (over the ring by default, as the forward)")
    ("do-dataset", po::value(&do_dataset)->default_value(do_dataset), "with --backward: path of dO (B, T, Hq, Dv) in the input")
    ("dlse-dataset", po::value(&dlse_dataset)->default_value(dlse_dataset), "with --backward: path of the optional "
     "dLoss/dlse (B, Hq, T) float32 in the input, where the loss reads lse too (read where present)")
    ("f32-gradients", po::bool_switch(&f32_gradients), "with --backward: write dq, dk, dv in f32 instead of the input dtype")
    ("grad-wire", po::value(&grad_wire)->default_value("f32"), kGradWireHelp)
    ("io-timeout", po::value(&io_timeout_s)->default_value(600), "seconds reading, checking or writing may take before the job is aborted");
  add_dataset_options(desc, datasets);
  add_attention_options(desc, opts, AttentionRegistry::builtin().list_implementations());
  if (!parse(argc, argv, desc, "Usage: mpirun -np N ringattn run --input F --output G [options]", &datasets,
             &opts.given))
    return kOk;
  check_options_apply(opts);
  const AttentionParams whole_params = to_params(opts);  // the output's attribute: every rank writes the same
  positive(io_timeout_s, "io-timeout");
  check_backward_options_apply(opts, backward, {"f32-gradients", "do-dataset", "dlse-dataset", "grad-wire"});
  const DType gradient_wire = parse_gradient_wire(grad_wire, "--grad-wire");
  check_ring_modes(opts.deterministic, gradient_wire, parse_backend(opts.backend));
  Job job(opts, mpi, args_text(argc, argv));
  const int rank = job.world.rank();
  const auto started = std::chrono::steady_clock::now();
  // Progress on rank 0, to stderr (stdout keeps the result lines), as training loops and nccl-tests do.
  auto progress = [&](const char* what) {
    if (quiet || rank != 0) return;
    std::fprintf(stderr, "ringattn run: [%7.2f s] %s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), what);
  };
  // Phases without a deadline of their own get one: the ring's per-step timeout times (steps + 2)
  // for the attention, and --io-timeout for reading, checking and writing.
  Watchdog watchdog(rank);
  watchdog.phase("reading the inputs", std::chrono::seconds(io_timeout_s));
  check_output_path(output, input, overwrite);  // before hours of compute, not after

  H5File file(input, H5File::Mode::kRead, job.world.comm());
  check_named_datasets(datasets, file);
  ShardPlan plan = plan_shards(file, job.shape, rank, chosen_layout(opts), datasets.names);
  const AttentionParams params = on_slice(whole_params, plan);
  bool with_lse_gradient = false;
  if (backward) {  // every rank decides alike, before any exchange
    RA_CHECK(job.sequence_axis().size() == 1 || opts.impl == "ring", "--backward with --impl ", opts.impl, " on the mesh ",
             job.shape.str(), ": a sequence split over ", job.sequence_axis().size(), " ranks needs --impl ring");
    check_upstream_gradient(file, plan, do_dataset);
    with_lse_gradient = check_lse_gradient(file, plan, dlse_dataset);
    const bool cudnn = opts.impl == "cudnn" || (opts.impl == "ring" && opts.local_impl == "cudnn");
    RA_CHECK(!with_lse_gradient || !cudnn, "dataset '", dlse_dataset, "' of '", input, "' (dLoss/dlse) needs a backward "
             "that takes it: cudnn's forms rowsum(do * o) itself; use flash_attn2 or sdpa (--impl, or --local-impl of the "
             "ring)");
  }
  if (rank == 0 && !quiet) {
    const std::string format_note = qkv_format_note(plan, input);
    if (!format_note.empty()) std::fprintf(stderr, "ringattn run: %s\n", format_note.c_str());
    const std::vector<std::string> unread = unread_datasets(file, datasets.names, {do_dataset, dlse_dataset});
    std::string list;
    for (const std::string& name : unread) list += (list.empty() ? "'" : ", '") + name + "'";
    if (!unread.empty())
      std::fprintf(stderr, "ringattn run: note: '%s' also holds %s, which run does not read (it reads q, k, v and the "
                   "optional mask, bias, sinks, segment_ids or cu_seqlens, do, dlse; --mask-dataset, "
                   "--segment-ids-dataset, --cu-seqlens-dataset ... name others)\n", input.c_str(), list.c_str());
  }
  // Before any allocation: the slices, and on GPUs the device's share, must fit.
  const std::vector<MemoryNeed> slices = local_input_bytes(plan, file);
  check_host_memory(slices, input, job.world.comm());
#if RA_HAVE_CUDA
  if (job.on_device) {
    std::vector<MemoryNeed> device = slices;
    for (const MemoryNeed& need : device_working_set(plan, job.sequence_axis().size())) device.push_back(need);
    check_device_memory(device, cuda_bytes_free(), job.world.comm());
  }
#endif
  if (!no_space_check) {
    const uint64_t rows = uint64_t(plan.batch) * uint64_t(plan.q_len) * uint64_t(plan.q_heads);
    uint64_t bytes = rows * (uint64_t(plan.v_head_dim) * dtype_size(plan.dtype) + 4) + (1u << 20);
    if (backward) {  // dq, dk, dv in the input dtype or f32 (dbias: at most the bias's size again)
      const uint64_t kv_rows = uint64_t(plan.batch) * uint64_t(plan.kv_len) * uint64_t(plan.kv_heads);
      bytes += (rows * uint64_t(plan.head_dim) + kv_rows * uint64_t(plan.head_dim + plan.v_head_dim)) *
               (f32_gradients ? 4 : dtype_size(plan.dtype));
    }
    check_output_space(output, bytes);
  }
  RingContext ctx;
  ctx.gradient_wire = gradient_wire;
  if (!quiet && rank == 0)
    ctx.on_step = [&](int step, int steps) {
      const std::string line = "ring step " + std::to_string(step + 1) + " of " + std::to_string(steps);
      progress(line.c_str());
    };
  auto impl = make_impl(opts, job, plan.q_len, plan.kv_len, ctx);
  const AttentionImpl& backward_impl = *impl;
  RA_CHECK(!backward || backward_impl.has_backward(), "--backward: implementation '", backward_impl.name(), "' on ",
           opts.backend, " has no backward pass");
  const TokenPositions pos = impl->name() == "ring" ? ring_positions(ctx) : TokenPositions::dense(plan.q_len, plan.kv_len);
  // Times of the slowest rank: [0] reading, [1] to the device, [2] the attention, [3] back to the host.
  double seconds[4] = {0, 0, 0, 0};
  auto lap = [last = std::chrono::steady_clock::now()]() mutable {  // seconds since the previous lap
    const auto now = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(now - std::exchange(last, now)).count();
  };
  // On GPUs, HDF5 reads into page-locked buffers, from which the copies to the device are plain DMA.
  const MemoryKind staging = job.on_device && !pageable ? MemoryKind::kPinned : MemoryKind::kHost;
  progress("reading the inputs");
  LocalTensors local = read_local(file, plan, false, staging);
  seconds[0] = lap();
  const AttentionInputs in = local.inputs();
  validate_attention(in, params, pos, impl->max_head_dim());  // before the first exchange
  const bool nonfinite_inputs = check_finite_inputs(local, plan, file, input, opts.allow_nonfinite, job) > 0;
  job.world.barrier();

  // The cuda backend copies the slices to the device, and O and LSE back to the same kind of host
  // memory for the collective write.
  watchdog.phase("the attention", std::chrono::seconds(opts.timeout_s * (job.sequence_axis().size() + 2)));
  lap();  // the checks above are not staging
  const InputsCopy staged = job.on_device ? copy_inputs(in, MemoryKind::kCuda) : InputsCopy{};
  seconds[1] = lap();
  progress(impl->name() == "ring" ? "the attention (ring steps follow)" : "the attention");
  AttentionOutput out = impl->forward(job.on_device ? staged.inputs : in, params, pos);
  job.synchronize();
  seconds[2] = lap();
  if (job.on_device) out = AttentionOutput{to_memory(out.o, staging), to_memory(out.lse, staging)};
  seconds[3] = lap();
  // The backward recomputes its own forward (keeping O in f32 for delta) and returns the gradients.
  Gradients grads;
  double backward_seconds = 0;
  if (backward) {
    progress("the backward pass");
    // Its own forward, then the backward's trip around the ring and the accumulators' last hop home.
    watchdog.phase("the backward pass", std::chrono::seconds(opts.timeout_s * (2 * job.sequence_axis().size() + 3)));
    const Tensor d_o = read_upstream_gradient(file, plan, do_dataset, staging);
    const Tensor d_o_device = job.on_device ? to_memory(d_o, MemoryKind::kCuda) : Tensor();
    const Tensor d_lse = with_lse_gradient ? read_lse_gradient(file, plan, dlse_dataset, staging) : Tensor();
    const Tensor d_lse_device = job.on_device && with_lse_gradient ? to_memory(d_lse, MemoryKind::kCuda) : Tensor();
    lap();
    // Kv heads shared by tp ranks: their parts leave in f32, summed below before any rounding.
    const bool shared_kv = plan.kv_head_sharers > 1;
    grads = backward_impl.backward(job.on_device ? staged.inputs : in, params, pos,
                                   job.on_device ? d_o_device.view() : d_o.view(), nullptr, f32_gradients || shared_kv,
                                   job.on_device ? d_lse_device.view() : d_lse.view());
    job.synchronize();
    backward_seconds = lap();
    if (job.on_device)
      for (Tensor* t : {&grads.dq, &grads.dk, &grads.dv, &grads.dbias, &grads.dsinks})
        if (t->defined()) *t = to_memory(*t, staging);
    if (shared_kv) {
      sum_shared_kv_heads(grads.dk, plan, job);
      sum_shared_kv_heads(grads.dv, plan, job);
      if (!f32_gradients)
        for (Tensor* t : {&grads.dq, &grads.dk, &grads.dv}) *t = gradient_in_dtype(std::move(*t), plan.dtype);
    }
  }
  job.world.all_reduce(seconds, 4, ReduceOp::kMax);
  job.world.all_reduce(&backward_seconds, 1, ReduceOp::kMax);

  watchdog.phase("checking and writing the outputs", std::chrono::seconds(io_timeout_s));
  progress("checking and writing the outputs");
  if (nonfinite_inputs) report_nonfinite_outputs(out, job);
  else check_output_invariants(in, params, out.o, out.lse, job.sequence_axis());
  std::map<std::string, std::string> attributes{
      {"impl", std::string(impl->name())}, {"local_impl", opts.local_impl}, {"backend", opts.backend},
      {"mesh", job.shape.str()}, {"layout", layout_name(ctx.layout)}, {"params", whole_params.describe()},
      {"input", input}, {"dtype", std::string(dtype_name(plan.dtype))},
      {"attention", attention_semantics(whole_params, plan.head_dim)},
      {"qkv_format", qkv_format_name(plan.names.format)}};
  if (backward && impl->name() == std::string_view("ring")) {  // what verify allows the bf16 wire's roundings
    attributes["grad_wire"] = dtype_name(gradient_wire);
    attributes["sequence_ranks"] = std::to_string(job.sequence_axis().size());
  }
  GradientSlices gradient_slices{grads.dq, grads.dk, grads.dv, grads.dbias, Shape{}, grads.dsinks};
  // dsinks sums over every query row: over the batch's dp ranks here (the ring summed its sequence axis).
  if (grads.dsinks.defined()) sum_over_mesh_axes(grads.dsinks, job, {"dp"});
  if (grads.dbias.defined()) {  // a bias broadcast over batch or heads is shared by the dp / tp ranks: sum
    gradient_slices.bias_shape = file.info(plan.names.bias).shape;
    sum_shared_bias_gradient(grads.dbias, gradient_slices.bias_shape, job, {"dp", "tp"});
  }
  write_outputs(output, plan, out.o, out.lse, attributes, job.world.comm(), overwrite,
                backward ? &gradient_slices : nullptr);
  watchdog.disarm();
  progress("done");
  if (rank == 0) {
    double flops = 4.0 * plan.batch * plan.q_heads * double(plan.q_len) * double(plan.kv_len) * plan.head_dim;
    if (params.causal) flops /= 2;
    std::printf("ringattn run: %s (%s) on mesh %s, layout %s: B=%ld T=%ld S=%ld Hq=%ld Hkv=%ld D=%ld %s, %.3f s, "
                "%.2f GFLOP/s total -> %s\n",
                std::string(impl->name()).c_str(), opts.backend.c_str(), job.shape.str().c_str(), layout_name(ctx.layout),
                long(plan.batch), long(plan.q_len), long(plan.kv_len), long(plan.q_heads), long(plan.kv_heads),
                long(plan.head_dim), std::string(dtype_name(plan.dtype)).c_str(), seconds[2], flops / seconds[2] * 1e-9,
                output.c_str());
    if (backward)  // FlashAttention's count: 2.5 times the forward's (five products instead of two)
      std::printf("ringattn run: backward (forward recomputed) %.3f s, %.2f GFLOP/s total; dq, dk, dv%s%s -> %s\n",
                  backward_seconds, 2.5 * flops / backward_seconds * 1e-9, grads.dbias.defined() ? ", dbias" : "",
                  grads.dsinks.defined() ? ", dsinks" : "", output.c_str());
    std::printf("ringattn run: reading %.3f s", seconds[0]);
    if (job.on_device)
      std::printf(", %s host -> device %.3f s, device -> host %.3f s", pageable ? "pageable" : "pinned", seconds[1],
                  seconds[3]);
    std::printf("\n");
  }
  return kOk;
}

}  // namespace ra::cli
