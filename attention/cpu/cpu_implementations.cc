// The CPU implementations as registry entries: sdpa, flash_attn2 (cpu: best SIMD; native: portable
// code only) and blockwise. Names and aliases follow the seeds.
#include "attention/backward.h"
#include "attention/cpu/blockwise_cpu.h"
#include "attention/cpu/flash_cpu.h"
#include "attention/registry.h"
#include "attention/ring/ring.h"
#include "attention/validate.h"
#include "runtime/error.h"
#include "attention/cpu/sdpa_cpu.h"

namespace ra {
namespace {

class SdpaCpu final : public AttentionImpl {
 public:
  explicit SdpaCpu(Backend backend) : backend_(backend) {}
  std::string_view name() const override { return "sdpa"; }
  int64_t max_head_dim() const override { return kAnyHeadDim; }
  Backend backend() const override { return backend_; }
  void accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                  Carry& carry) const override {
    sdpa_accumulate_cpu(in, pos, params, carry);
  }
  bool has_backward() const override { return true; }
  void accumulate_backward(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                           const BackwardInputs& grad, const GradViews& acc) const override {
    sdpa_accumulate_backward_cpu(in, pos, params, grad, acc);
  }

 private:
  Backend backend_;
};

class FlashCpu final : public AttentionImpl {
 public:
  explicit FlashCpu(Backend backend) : backend_(backend) {}
  std::string_view name() const override { return "flash_attn2"; }
  Backend backend() const override { return backend_; }
  int64_t max_head_dim() const override { return kFlashCpuMaxHeadDim; }
  CpuIsa isa() const { return backend_ == Backend::kNative ? CpuIsa::kGeneric : best_cpu_isa(); }
  void accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                  Carry& carry) const override {
    flash_accumulate_cpu(in, pos, params, carry, isa());
  }
  bool has_backward() const override { return true; }
  void accumulate_backward(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                           const BackwardInputs& grad, const GradViews& acc) const override {
    flash_accumulate_backward_cpu(in, pos, params, grad, acc, isa());
  }

 private:
  Backend backend_;
};

class BlockwiseCpu final : public AttentionImpl {
 public:
  explicit BlockwiseCpu(Backend backend) : backend_(backend) {}
  std::string_view name() const override { return "blockwise"; }
  int64_t max_head_dim() const override { return kAnyHeadDim; }
  Backend backend() const override { return backend_; }
  void accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                  Carry& carry) const override {
    blockwise_accumulate_cpu(in, pos, params, carry);
  }
  bool has_backward() const override { return true; }
  void accumulate_backward(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                           const BackwardInputs& grad, const GradViews& acc) const override {
    blockwise_accumulate_backward_cpu(in, pos, params, grad, acc);
  }

 private:
  Backend backend_;
};

template <typename Impl>
void register_cpu(AttentionRegistry& registry, const std::vector<std::string>& names) {
  for (Backend backend : {Backend::kCpu, Backend::kNative})
    registry.register_impl(names, backend, [backend](const RingContext*) { return std::make_unique<Impl>(backend); });
}

}  // namespace

void register_builtin_implementations(AttentionRegistry& registry) {
  register_cpu<SdpaCpu>(registry, {"sdpa", "scaled_dot_product_attention", "vanilla"});
  register_cpu<FlashCpu>(registry, {"flash_attn2", "flash", "flash_attention"});
  register_cpu<BlockwiseCpu>(registry, {"blockwise", "blockwise_attn"});
  for (Backend backend : {Backend::kCpu, Backend::kNative})
    registry.register_impl({"ring", "ring_attention"}, backend, [backend](const RingContext* ctx) {
      RA_CHECK(ctx != nullptr, "attention implementation 'ring' needs a RingContext (communicator, layout, lengths)");
      return std::make_unique<RingAttention>(*ctx, backend);
    });
#if RA_HAVE_CUDA
  register_cuda_implementations(registry);
#endif
}

}  // namespace ra
