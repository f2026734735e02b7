// `ringattn bench --backward`: a training step's attention, timed in two parts: the forward (into O and
// LSE made once), then the single-call backward given them (AttentionImpl::backward: delta, zeroed f32
// accumulators, accumulate_backward and dq / dk / dv converted into gradients made once, or what the
// implementation does instead, e.g. cuDNN writing them directly), as the Python layer calls them. The ring
// on N CPU or GPU ranks, or one rank's local implementation. Rows: forward, backward and forward+backward,
// TFLOP/s per rank with FlashAttention's count (the backward 2.5 times the forward's FLOPs, halved for
// causal) and, on GPUs, the peak device memory of the backward against the memory its tensors need.
#include "launch/bench_backward.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <utility>

#include "attention/registry.h"
#include "attention/ring/ring.h"
#include "attention/validate.h"
#include "launch/bench_documents.h"
#include "launch/bench_extras.h"
#include "launch/bench_timing.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "runtime/random.h"

namespace ra::cli {
namespace {

// --step-times: each rank's spans of device time in the last iteration's backward, rank by rank.
void print_spans(const AttentionImpl& impl, Job& job) {
  const RingStats* stats = ring_stats(impl);
  for (int r = 0; r < job.world.size(); ++r) {
    job.world.barrier();
    if (r != job.world.rank() || stats == nullptr) continue;
    std::printf("  rank %d, the last backward's device time (ms after its first span; compute stream and transfers):\n", r);
    for (const DeviceSpan& s : stats->spans)
      std::printf("    %9.3f %9.3f  %7.3f  %s\n", s.start_ms, s.end_ms, s.end_ms - s.start_ms, s.what.c_str());
    std::fflush(stdout);
  }
  job.world.barrier();
}

}  // namespace

int bench_backward(const BackwardBenchShape& shape, const AttentionOptions& opts, Job& job) {
  const AttentionParams params = to_params(opts);
  const AttentionRegistry& registry = AttentionRegistry::builtin();
  const bool ring = registry.canonical_name(opts.impl) == "ring";
  // The ring on the job's sequence axis (host or GPU ring), or one call of the named implementation.
  RingContext ctx;
  ctx.gradient_wire = shape.gradient_wire;
  ctx.time_steps = shape.step_times;  // the GPU ring's spans (bench.cc refuses it elsewhere)
  std::unique_ptr<AttentionImpl> impl;
  if (ring) {
    impl = make_impl(opts, job, shape.seq, shape.seq, ctx);
  } else {
    impl = registry.create(opts.impl, parse_backend(opts.backend));
    check_flash_kernel_choice(*impl, params);
    impl->set_cuda_stream(job.stream());
  }
  RA_CHECK(impl->has_backward(), "bench --backward: implementation '", impl->name(), "' on ", opts.backend,
           " has no backward pass");
  const int64_t B = shape.batch, T = shape.seq, H = shape.heads, Hkv = shape.kv_heads, D = shape.head_dim,
                Dv = shape.v_head_dim;
  const TokenPositions pos = impl->name() == "ring" ? ring_positions(ctx) : TokenPositions::dense(T, T);
  const int ranks = impl->name() == "ring" ? ctx.comm->size() : 1;
  const int64_t local = int64_t(pos.q.size()), local_kv = int64_t(pos.k.size());
  std::mt19937_64 rng(1000 + uint64_t(job.world.rank()));
  const Tensor q = random_normal(shape.dtype, {B, local, H, D}, rng);
  const Tensor k = random_normal(shape.dtype, {B, local_kv, Hkv, D}, rng);
  const Tensor v = random_normal(shape.dtype, {B, local_kv, Hkv, Dv}, rng);
  const Tensor d_o = random_normal(shape.dtype, {B, local, H, Dv}, rng);
  AttentionInputs host_in;
  host_in.q = q;
  host_in.k = k;
  host_in.v = v;
  Tensor q_segments, kv_segments;
  const Tensor documents = shape.mask_documents ? document_mask(pos.q, T, shape.segments) : Tensor();
  host_in.mask = documents;
  if (shape.segments > 0 && !shape.mask_documents) {
    q_segments = packed_segment_ids(B, pos.q, T, shape.segments);
    kv_segments = packed_segment_ids(B, pos.k, T, shape.segments);
    host_in.q_segment_ids = q_segments;
    host_in.kv_segment_ids = kv_segments;
  }
  const Tensor bias = shape.bias ? bench_bias(local, T, rng) : Tensor();
  const Tensor mask = shape.mask ? bench_mask(local, T, rng) : Tensor();
  host_in.bias = bias;
  if (shape.mask) host_in.mask = mask;
  const InputsCopy staged = job.on_device ? copy_inputs(host_in, MemoryKind::kCuda) : InputsCopy{};
  AttentionInputs in = job.on_device ? staged.inputs : host_in;
  in.mask_identity = shape.mask_named ? kBenchMaskName : 0;
  const Tensor d_o_run = job.on_device ? to_memory(d_o, MemoryKind::kCuda) : Tensor();
  const TensorView d_o_view = job.on_device ? d_o_run.view() : d_o.view();
  validate_attention(in, params, pos, impl->max_head_dim());
  // One iteration = a training step's attention: the forward, then the backward given its O and LSE,
  // into outputs made once, as a framework's allocator hands them to the Python layer (the single-call
  // forms that allocate their results would time cudaMalloc too).
  const MemoryKind memory = in.q.memory();
  const Tensor o(shape.dtype, {B, local, H, Dv}, memory), lse(DType::kF32, {B, H, local}, memory);
  const DType grad_dtype = shape.f32_gradients ? DType::kF32 : shape.dtype;
  const Tensor dq(grad_dtype, in.q.shape(), memory), dk(grad_dtype, in.k.shape(), memory),
      dv(grad_dtype, in.v.shape(), memory);
  const ForwardViews forward_out{o.view(), lse.view()};
  const GradViews gradients{dq.view(), dk.view(), dv.view(), {}};
  IterationTimer timer(job);
  std::vector<double> forward_times, backward_times, step_times;
  double device_gib = 0;
  for (int64_t it = 0; it < shape.warmup + shape.iters; ++it) {
    job.world.barrier();
    timer.start();
    impl->forward_into(in, params, pos, forward_out);
    double times[2] = {timer.stop_seconds(), 0};
#if RA_HAVE_CUDA
    if (job.on_device) cuda_reset_allocated_peak();
#endif
    timer.start();
    const Gradients grads = impl->backward(in, params, pos, d_o_view, forward_out, shape.f32_gradients, &gradients);
    times[1] = timer.stop_seconds();
#if RA_HAVE_CUDA  // the backward's high-water mark of ringattn's device allocations (inputs, O, dO included)
    if (job.on_device) device_gib = std::max(device_gib, double(cuda_allocated_peak_bytes()) / double(1 << 30));
#endif
    job.world.all_reduce(times, 2, ReduceOp::kMax);  // the slowest rank's
    if (it >= shape.warmup) {
      forward_times.push_back(times[0]);
      backward_times.push_back(times[1]);
      step_times.push_back(times[0] + times[1]);
    }
  }
  // FLOPs per rank: the forward's 2 B H T S (D + Dv) (halved for causal, divided by the documents), the
  // backward 2.5 times that.
  const double flops = attention_flops(B, H, attended_pairs(T, shape.segments, params.causal), D, Dv) / ranks;
  // What the backward's tensors need: q, k, v, O, dO (input dtype), LSE and delta (f32), the f32
  // accumulators dq, dk, dv, and the gradients in the input dtype.
  const double elem = double(dtype_size(shape.dtype)), rows_q = double(B * local * H), rows_kv = double(B * local_kv * Hkv);
  // The ring adds two K/V blocks, two f32 dK/dV accumulators in flight and one partial.
  const double kv_row = double(D + Dv), q_row = double(D + 2 * Dv);  // k + v; q + o + dO
  const double ring_buffers = ranks > 1 ? (2 * elem * rows_kv * kv_row + 3 * 4 * rows_kv * kv_row) : 0;
  const double theory = (elem * (rows_q * q_row + rows_kv * kv_row) + 8 * rows_q + 4 * (rows_q * D + rows_kv * kv_row) +
                         double(dtype_size(grad_dtype)) * (rows_q * D + rows_kv * kv_row) + ring_buffers) / double(1 << 30);
  if (shape.step_times) print_spans(*impl, job);
  char peak_text[32] = "-";
  if (job.on_device) std::snprintf(peak_text, sizeof(peak_text), "%.2f", device_gib);
  if (job.world.rank() != 0) return kOk;
  std::printf("#%11s %8s %5s %5s %8s %4s %4s %4s %5s %6s %17s %10s %11s %12s\n", "impl", "backend", "ranks", "B", "T",
              "H", "Hkv", "D", "dtype", "causal", "pass", "time_ms", "TFLOP/s", "peak_GiB");
  const std::pair<const char*, std::pair<const std::vector<double>*, double>> rows[3] = {
      {"forward", {&forward_times, 1.0}}, {"backward", {&backward_times, 2.5}}, {"forward+backward", {&step_times, 3.5}}};
  for (const auto& [pass, timing] : rows) {
    const double time = median(*timing.first);
    std::printf(" %11s %8s %5d %5ld %8ld %4ld %4ld %4s %5s %6d %17s %10.3f %11.3f %12s\n",
                std::string(impl->name()).c_str(), opts.backend.c_str(), ranks, long(B), long(T), long(H), long(Hkv),
                head_dims_text(D, Dv).c_str(), std::string(dtype_name(shape.dtype)).c_str(), int(params.causal), pass, time * 1e3,
                timing.second * flops / time * 1e-12, std::string(pass) == "backward" ? peak_text : "-");
  }
  if (job.on_device)
    std::printf("  peak device memory of the backward %.2f GiB (ringattn's allocations: inputs, O, dO, scratch and "
                "workspaces it hands to libraries; not the CUDA context); its tensors in theory %.2f GiB (q, k, v, o, "
                "do, lse, delta, f32 dq / dk / dv, dq / dk / dv%s)\n", device_gib, theory,
                ranks > 1 ? "; the ring's two K/V blocks, two f32 dK/dV accumulators and a partial"
                          : "; one call of flash_attn2 or cudnn holds no f32 dk / dv");
  return kOk;
}

}  // namespace ra::cli
