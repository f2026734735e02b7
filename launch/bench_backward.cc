// `ringattn bench --backward`: the backward of one local implementation on one rank. O and LSE come
// from one forward; a timed iteration is the single-call backward a training step makes
// (AttentionImpl::backward with the forward's output: delta, zeroed f32 accumulators,
// accumulate_backward and dq / dk / dv in the input dtype, or what the implementation does instead,
// e.g. cuDNN writing them directly). Reported: TFLOP/s with
// FlashAttention's count (2.5 times the forward's FLOPs, halved for causal) and, on GPUs, the peak
// device memory of the call against the memory its tensors need.
#include "launch/bench_backward.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <utility>

#include "attention/registry.h"
#include "attention/validate.h"
#include "launch/bench_timing.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "runtime/random.h"

namespace ra::cli {

int bench_backward(const BackwardBenchShape& shape, const AttentionOptions& opts, Job& job) {
  const AttentionParams params = to_params(opts);
  RA_CHECK(job.world.size() == 1, "bench --backward runs one rank's local backward (the ring's backward is not built "
           "yet); run it without mpirun -np N");
  const AttentionRegistry& registry = AttentionRegistry::builtin();
  const std::string name = registry.canonical_name(opts.impl) == "ring" ? opts.local_impl : opts.impl;
  auto impl = registry.create(name, parse_backend(opts.backend));
  impl->set_cuda_stream(job.stream());
  RA_CHECK(impl->has_backward(), "bench --backward: implementation '", impl->name(), "' on ", opts.backend,
           " has no backward pass");
  const int64_t B = shape.batch, T = shape.seq, H = shape.heads, Hkv = shape.kv_heads, D = shape.head_dim;
  std::mt19937_64 rng(1000);
  const Tensor q = random_normal(shape.dtype, {B, T, H, D}, rng), k = random_normal(shape.dtype, {B, T, Hkv, D}, rng);
  const Tensor v = random_normal(shape.dtype, {B, T, Hkv, D}, rng), d_o = random_normal(shape.dtype, {B, T, H, D}, rng);
  AttentionInputs host_in;
  host_in.q = q;
  host_in.k = k;
  host_in.v = v;
  const MemoryKind memory = job.memory();
  const InputsCopy staged = job.on_device ? copy_inputs(host_in, MemoryKind::kCuda) : InputsCopy{};
  const AttentionInputs& in = job.on_device ? staged.inputs : host_in;
  const Tensor d_o_run = job.on_device ? to_memory(d_o, MemoryKind::kCuda) : Tensor();
  const TensorView d_o_view = job.on_device ? d_o_run.view() : d_o.view();
  const TokenPositions pos = TokenPositions::dense(T, T);
  validate_attention(in, params, pos, impl->max_head_dim());
  const AttentionOutput out = impl->forward(in, params, pos);
  void* stream = job.stream();
  IterationTimer timer(job);
  std::vector<double> times;
  double device_gib = 0;
  for (int64_t it = 0; it < shape.warmup + shape.iters; ++it) {
#if RA_HAVE_CUDA
    if (job.on_device) cuda_reset_allocated_peak();
#endif
    timer.start();
    const Gradients grads = impl->backward(in, params, d_o_view, &out);
    const double t = timer.stop_seconds();
    if (it >= shape.warmup) times.push_back(t);
#if RA_HAVE_CUDA  // the call's high-water mark of ringattn's device allocations (inputs, O, dO included)
    if (job.on_device) device_gib = std::max(device_gib, double(cuda_allocated_peak_bytes()) / double(1 << 30));
#endif
  }
  const double time = median(times);
  double flops = 2.5 * 4.0 * double(B) * double(H) * double(T) * double(T) * double(D);
  if (params.causal) flops /= 2;
  // What the call's tensors need: q, k, v, O, dO (input dtype), LSE and delta (f32), the f32
  // accumulators dq, dk, dv, and the gradients in the input dtype.
  const double elem = double(dtype_size(shape.dtype)), rows_q = double(B * T * H), rows_kv = double(B * T * Hkv);
  const double theory = (elem * (3 * rows_q * D + 2 * rows_kv * D) + 8 * rows_q + 4 * (rows_q + 2 * rows_kv) * D +
                         elem * (rows_q + 2 * rows_kv) * D) / double(1 << 30);
  char peak_text[32] = "-";
  if (job.on_device) std::snprintf(peak_text, sizeof(peak_text), "%.2f", device_gib);
  const std::string peak = peak_text;
  std::printf("#%11s %8s %5s %8s %4s %4s %4s %5s %6s %10s %11s %12s\n", "impl", "backend", "B", "T", "H", "Hkv", "D",
              "dtype", "causal", "time_ms", "bwd_TFLOP/s", "peak_GiB");
  std::printf(" %11s %8s %5ld %8ld %4ld %4ld %4ld %5s %6d %10.3f %11.2f %12s\n", std::string(impl->name()).c_str(),
              opts.backend.c_str(), long(B), long(T), long(H), long(Hkv), long(D),
              std::string(dtype_name(shape.dtype)).c_str(), int(params.causal), time * 1e3, flops / time * 1e-12,
              peak.c_str());
  if (job.on_device)
    std::printf("  peak device memory of the call %.2f GiB (ringattn's allocations: inputs, O, dO, scratch and workspaces "
                "it hands to libraries; not the CUDA context); its tensors in theory %.2f GiB (q, k, v, o, do, lse, "
                "delta, f32 dq / dk / dv, dq / dk / dv)\n", device_gib, theory);
  return kOk;
}

}  // namespace ra::cli
