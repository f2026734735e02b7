// The CUDA implementations as registry entries: flash_attn2 (tensor cores) and sdpa (cuBLAS).
#include "attention/cuda/cuda_attention.h"
#include "attention/cuda/flash_backward_cuda.h"
#include "attention/cuda/flash_cuda.h"
#include "attention/ring/ring_cuda.h"
#include "attention/cuda/sdpa_cuda.h"
#include "attention/registry.h"
#include "runtime/error.h"

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
  bool has_backward() const override { return true; }
  void accumulate_backward_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                                  const BackwardInputs& grad, const GradViews& acc) const override {
    check_flash_backward_cuda_supported(in, grad, acc);
    FlashBackwardArgs g{make_cuda_args(in, pos, params), DeviceView4{grad.d_o.data(), {grad.d_o.stride(0),
                        grad.d_o.stride(1), grad.d_o.stride(2), grad.d_o.stride(3)}}, grad.lse.data_as<float>(),
                        grad.delta.data_as<float>(), acc.dq.data_as<float>(), acc.dk.data_as<float>(),
                        acc.dv.data_as<float>(), DeviceView4{}};
    if (acc.dbias.defined()) {
      const TensorView dbias = broadcast_to(acc.dbias, Shape{in.q.dim(0), in.q.dim(2), in.q.dim(1), pos.total_keys}, "dbias");
      g.dbias = DeviceView4{dbias.data(), {dbias.stride(0), dbias.stride(1), dbias.stride(2), dbias.stride(3)}};
    }
    flash_backward_cuda(g, in.q.dtype(), stream_);
  }
};

class SdpaCuda final : public CudaAttentionImpl {
 public:
  std::string_view name() const override { return "sdpa"; }
  void accumulate_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                         Carry& carry) const override {
    runner_.accumulate(in, make_cuda_args(in, pos, params, carry), stream_);
  }
  bool has_backward() const override { return true; }
  void accumulate_backward_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                                  const BackwardInputs& grad, const GradViews& acc) const override {
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
