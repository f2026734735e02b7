// The CUDA implementations as registry entries: flash_attn2 (tensor cores) and sdpa (cuBLAS).
#include "attention/backward.h"
#include "attention/cuda/backward_cuda.h"
#include "attention/cuda/cuda_attention.h"
#include "attention/cuda/flash_backward_cuda.h"
#include "attention/cuda/flash_cuda.h"
#include "attention/ring/ring_cuda.h"
#include "attention/cuda/sdpa_cuda.h"
#include "attention/registry.h"
#include "attention/validate.h"
#include "runtime/error.h"
#include "runtime/memory.h"

#include <utility>

namespace ra {

void register_cudnn_implementation(AttentionRegistry& registry);  // cudnn_attention.cc

void CudaAttentionImpl::accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                                   Carry& carry) const {
  check_supported(in, params);
  accumulate_device(in, positions_.upload(pos, stream_), params, carry);
}

void CudaAttentionImpl::accumulate_backward(const AttentionInputs& in, const TokenPositions& pos,
                                            const AttentionParams& params, const BackwardInputs& grad,
                                            const GradViews& acc) const {
  RA_CHECK(has_backward(), "attention implementation '", name(), "' on cuda has no backward pass");
  check_backward_supported(in, params);
  for (auto [t, what] : {std::pair{&grad.d_o, "do"}, std::pair{&grad.lse, "lse"}, std::pair{&grad.delta, "delta"},
                         std::pair{&acc.dq, "dq"}, std::pair{&acc.dk, "dk"}, std::pair{&acc.dv, "dv"}})
    RA_CHECK(t->memory() == MemoryKind::kCuda, what, " is in host memory; the cuda backward needs it on the device");
  accumulate_backward_device(in, device_positions(pos), params, grad, acc);
}

GradViews CudaAttentionImpl::gradients_in_q_dtype(const AttentionInputs& in, Gradients& out, const GradViews* into) {
  if (into != nullptr) return *into;
  out.dq = Tensor(in.q.dtype(), in.q.shape(), MemoryKind::kCuda);
  out.dk = Tensor(in.q.dtype(), in.k.shape(), MemoryKind::kCuda);
  out.dv = Tensor(in.q.dtype(), in.v.shape(), MemoryKind::kCuda);
  return GradViews{out.dq, out.dk, out.dv, {}};
}

bool CudaAttentionImpl::writes_into_views(const GradViews* into) {
  if (into == nullptr) return true;
  for (const TensorView* view : {&into->dq, &into->dk, &into->dv})
    if (reinterpret_cast<uintptr_t>(view->data()) % 16 != 0) return false;
  return true;
}

namespace {

class FlashCuda final : public CudaAttentionImpl {
 public:
  std::string_view name() const override { return "flash_attn2"; }
  bool takes_flash_kernel() const override { return true; }
  int64_t max_head_dim() const override { return 256; }
  void check_supported(const AttentionInputs& in, const AttentionParams&) const override {
    check_flash_cuda_supported(in);
  }
  void accumulate_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                         Carry& carry) const override {
    CudaAttentionArgs args = make_cuda_args(in, pos, params, carry);
    args.after_carry_writer = after_carry_writer_;
    flash_accumulate_cuda(args, in.q.dtype(), stream_);
  }
  // A single call on the wgmma kernel writes O and LSE itself: no carry to reset, carry through the
  // kernel and finalize (the mma.sync kernel keeps the carry path).
  bool forward_direct(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                      const ForwardViews& out) const override {
    if (in.k.dim(1) == 0) return false;  // no key, no kernel: finalize writes the empty rows
    check_supported(in, params);
    DevicePositions unplaced;  // the kernel's choice first: positions go up only for it
    unplaced.total_keys = pos.total_keys;
    CudaAttentionArgs args = make_cuda_args(in, unplaced, params);
    if (!flash_uses_wgmma(args)) return false;
    RA_CHECK(!in.sinks.defined() || in.sinks.memory() == MemoryKind::kCuda, "sinks is in host memory; the cuda "
             "backend needs it in device memory");
    args.pos = positions_.upload(pos, stream_);
    args.o_direct = out.o.data();
    args.lse_direct = out.lse.data_as<float>();
    args.o_f32 = out.o.dtype() == DType::kF32;
    if (in.sinks.defined()) args.sinks = in.sinks.data_as<float>(), args.sink_stride = in.sinks.stride(0);
    flash_accumulate_cuda(args, in.q.dtype(), stream_);
    return true;
  }
  bool has_backward() const override { return true; }
  // --deterministic orders dQ's adds, and its dQ slices and turn counters are the object's.
  bool independent_backward_calls(const AttentionParams& params) const override { return !params.deterministic; }
  void accumulate_backward_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                                  const BackwardInputs& grad, const GradViews& acc) const override {
    check_flash_backward_cuda_supported(in, grad, acc);
    FlashBackwardArgs g = backward_args(in, pos, params, grad, acc.dq);
    g.dk = acc.dk.data_as<float>();
    g.dv = acc.dv.data_as<float>();
    if (const TensorView dbias = dbias_over_pairs(acc.dbias, in, pos.total_keys); dbias.defined()) {
      check_dbias_deterministic(dbias, params);
      g.dbias = DeviceView4{dbias.data(), {dbias.stride(0), dbias.stride(1), dbias.stride(2), dbias.stride(3)}};
    }
    flash_backward_cuda(g, in.q.dtype(), params.deterministic ? &dq_slices_ : nullptr, stream_);
  }
  // A single call's backward: the kernels write dK and dV in q's dtype themselves (one writer per key row
  // in a call), so only dQ goes through an f32 accumulator; no zeroing, reading or converting of f32 dK /
  // dV. A bias whose gradient is asked for (dbias) takes the accumulator path.
  bool backward_into(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                     const BackwardInputs& grad, Gradients& out, const GradViews* into) const override {
    if (bias_gradient_wanted(in, into) || !writes_into_views(into)) return false;
    check_backward_supported(in, params);
    // dQ's f32 accumulator, zeroed by delta's pass where this call forms delta (once a call), as FlashAttention-2's
    // preprocess clears its dQ: one launch less, 1.00-1.02x a backward on short documents (bench/RESULTS.md, "dQ's
    // zeros written by delta's pass").
    const Tensor dq_bytes = Tensor::scratch(size_t(in.q.numel()) * sizeof(float), MemoryKind::kCuda, stream_,
                                            "the backward's f32 dQ");
    const TensorView dq(dq_bytes.view().data(), DType::kF32, in.q.shape(), MemoryKind::kCuda);
    check_flash_backward_cuda_supported(in, grad, GradViews{dq, dq, dq, {}});
    if (grad.delta.defined()) fill_zero_temporary_bytes(dq.data(), dq.nbytes(), MemoryKind::kCuda, stream_);
    const Tensor delta =
        grad.delta.defined() ? Tensor() : compute_delta(grad.o, grad.d_o, grad.d_lse, stream_, /*zero=*/dq);
    const GradViews views = gradients_in_q_dtype(in, out, into);
    BackwardInputs with_delta = grad;
    if (delta.defined()) with_delta.delta = delta;
    FlashBackwardArgs g = backward_args(in, device_positions(pos), params, with_delta, dq);
    g.dk_direct = views.dk.data();
    g.dv_direct = views.dv.data();
    flash_backward_cuda(g, in.q.dtype(), params.deterministic ? &dq_slices_ : nullptr, stream_);
    convert_gradient(dq, views.dq, stream_);
    return true;
  }

 private:
  static FlashBackwardArgs backward_args(const AttentionInputs& in, const DevicePositions& pos,
                                         const AttentionParams& params, const BackwardInputs& grad, const TensorView& dq) {
    return FlashBackwardArgs{make_cuda_args(in, pos, params), DeviceView4{grad.d_o.data(), {grad.d_o.stride(0),
                             grad.d_o.stride(1), grad.d_o.stride(2), grad.d_o.stride(3)}}, grad.lse.data_as<float>(),
                             grad.delta.data_as<float>(), dq.data_as<float>(), nullptr, nullptr, DeviceView4{}};
  }

  mutable Tensor dq_slices_;  // the deterministic backward's (flash_backward_cuda)
};

class SdpaCuda final : public CudaAttentionImpl {
 public:
  std::string_view name() const override { return "sdpa"; }
  int64_t max_head_dim() const override { return kAnyHeadDim; }
  void accumulate_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                         Carry& carry) const override {
    runner_.accumulate(in, make_cuda_args(in, pos, params, carry), stream_);
  }
  bool has_backward() const override { return true; }
  void accumulate_backward_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                                  const BackwardInputs& grad, const GradViews& acc) const override {
    check_dbias_deterministic(dbias_over_pairs(acc.dbias, in, pos.total_keys), params);
    runner_.accumulate_backward(in, make_cuda_args(in, pos, params), grad, acc, stream_);
  }

 private:
  SdpaCudaRunner runner_;
};

}  // namespace

void register_cuda_implementations(AttentionRegistry& registry) {
  registry.register_impl({"flash_attn2", "flash", "flash_attention"}, Backend::kCuda,
                         [](const RingContext*) { return std::make_unique<FlashCuda>(); });
  registry.register_impl({"sdpa", "scaled_dot_product_attention", "vanilla"}, Backend::kCuda,
                         [](const RingContext*) { return std::make_unique<SdpaCuda>(); });
#if RA_HAVE_CUDNN
  register_cudnn_implementation(registry);
#endif
  registry.register_impl({"ring", "ring_attention"}, Backend::kCuda, [](const RingContext* ctx) {
    RA_CHECK(ctx != nullptr, "attention implementation 'ring' needs a RingContext (communicator, layout, lengths)");
    return std::make_unique<RingAttentionCuda>(*ctx);
  });
}

}  // namespace ra
