// Front of the CPU flash kernel: f32 views, the plain params struct, and the ISA dispatch.
#include "attention/cpu/flash_cpu.h"

#include <omp.h>

#include "attention/validate.h"
#include "runtime/error.h"

namespace ra {

CpuIsa best_cpu_isa() {
#if defined(__x86_64__) && defined(RA_HAVE_X86_ISAS)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) return CpuIsa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kGeneric;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx2: return "avx2";
    default: return "generic";
  }
}

namespace {

// The plain kernel parameters of f32 inputs (no carry).
FlashCpuParams kernel_params(const F32Inputs& in, const TokenPositions& pos, const AttentionParams& params) {
  FlashCpuParams p{};
  p.q = in.q.data_as<float>();
  p.k = in.k.data_as<float>();
  p.v = in.v.data_as<float>();
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = in.q.stride(i);
    p.k_stride[i] = in.k.stride(i);
    p.v_stride[i] = in.v.stride(i);
  }
  p.batch = in.q.dim(0);
  p.q_rows = in.q.dim(1);
  p.q_heads = in.q.dim(2);
  p.head_dim = in.q.dim(3);
  p.kv_rows = in.k.dim(1);
  p.kv_heads = in.k.dim(2);
  p.value_dim = in.v.dim(3);
  p.scale = effective_scale(params, p.head_dim);
  p.softcap = params.logits_soft_cap;
  p.causal = params.causal;
  p.window_left = params.window_left;
  p.window_right = params.window_right;
  p.q_pos = pos.q.data();
  p.k_pos = pos.k.data();
  if (in.bias.defined()) {
    p.bias = in.bias.data_as<float>();
    for (int i = 0; i < 4; ++i) p.bias_stride[i] = in.bias.stride(i);
  }
  if (in.mask.defined()) {
    p.mask = in.mask.data_as<uint8_t>();
    for (int i = 0; i < 4; ++i) p.mask_stride[i] = in.mask.stride(i);
  }
  if (in.q_segment_ids.defined()) {
    p.q_seg = in.q_segment_ids.data_as<int32_t>();
    p.k_seg = in.kv_segment_ids.data_as<int32_t>();
    for (int i = 0; i < 2; ++i) {
      p.q_seg_stride[i] = in.q_segment_ids.stride(i);
      p.k_seg_stride[i] = in.kv_segment_ids.stride(i);
    }
  }
  p.dropout_prob = params.dropout_prob;
  p.dropout_seed = params.dropout_seed;
  p.batch_offset = params.batch_offset;
  p.head_offset = params.head_offset;
  return p;
}

}  // namespace

void flash_accumulate_cpu(const AttentionInputs& in_raw, const TokenPositions& pos, const AttentionParams& params,
                          Carry& carry, CpuIsa isa) {
  const F32Inputs in = as_f32_inputs(in_raw, pos);
  FlashCpuParams p = kernel_params(in, pos, params);
  p.carry_num = carry.numerator.data<float>();
  p.carry_den = carry.denominator.data<float>();
  p.carry_max = carry.max.data<float>();
  if (p.q_rows == 0 || p.kv_rows == 0) return;
  switch (isa) {
#if defined(RA_HAVE_X86_ISAS)
    case CpuIsa::kAvx512: isa_avx512::flash_forward(p); return;
    case CpuIsa::kAvx2: isa_avx2::flash_forward(p); return;
#endif
    default: isa_generic::flash_forward(p); return;
  }
}

void flash_accumulate_backward_cpu(const AttentionInputs& in_raw, const TokenPositions& pos,
                                   const AttentionParams& params, const BackwardInputs& grad, const GradViews& acc,
                                   CpuIsa isa, CpuDqStrategy dq) {
  const F32Inputs in = as_f32_inputs(in_raw, pos);
  const Tensor d_o = f32_copy(grad.d_o);
  FlashCpuBackwardParams g{kernel_params(in, pos, params), d_o.data<float>(), grad.lse.data_as<float>(),
                           grad.delta.data_as<float>(), acc.dq.data_as<float>(), acc.dk.data_as<float>(),
                           acc.dv.data_as<float>(), nullptr, {}};
  if (const TensorView dbias = dbias_over_pairs(acc.dbias, in_raw, pos.total_keys); dbias.defined()) {
    g.dbias = dbias.data_as<float>();
    for (int i = 0; i < 4; ++i) g.dbias_stride[i] = dbias.stride(i);
  }
  if (in.q.dim(1) == 0 || in.k.dim(1) == 0) return;
  const int64_t threads = omp_get_max_threads();
  const int64_t partial_bytes = threads * in.q.numel() * int64_t(sizeof(float));
  const bool partials_pay = partial_bytes <= kDqPartialsBudgetBytes && in.k.dim(1) >= 16 * threads * threads;
  g.dq_thread_partials = dq == CpuDqStrategy::kThreadPartials || (dq == CpuDqStrategy::kAuto && partials_pay);
  switch (isa) {
#if defined(RA_HAVE_X86_ISAS)
    case CpuIsa::kAvx512: isa_avx512::flash_backward(g); return;
    case CpuIsa::kAvx2: isa_avx2::flash_backward(g); return;
#endif
    default: isa_generic::flash_backward(g); return;
  }
}

}  // namespace ra
