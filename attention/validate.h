// Checks an attention call once, at the public boundary: every message names the tensor, the
// dimension and what was expected. Inner kernels assume what this establishes.
#pragma once

#include "attention/inputs.h"
#include "attention/params.h"

namespace ra {

// The head dim of implementations whose loops take any (sdpa, blockwise): bounded only so that sizes stay
// far from overflow.
inline constexpr int64_t kAnyHeadDim = int64_t(1) << 20;

// `max_head_dim`: the largest D / Dv the implementation supports. `f64`: the inputs of the f64 reference
// (q, k, v may be f64 too, bias and sinks f32 or f64); the kernels take f32, f16 and bf16.
void validate_attention(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                        int64_t max_head_dim, bool f64 = false);

// The inputs as the host kernels read them, in f32 (the kernels) or f64 (the f64 reference): q, k, v,
// bias and sinks in that dtype with a contiguous last dimension (converted copies kept here where they
// are in another), bias and mask broadcast to (B, Hq, T, S_total).
struct HostInputs {
  TensorView q, k, v, bias, mask, sinks, q_segment_ids, kv_segment_ids;
  Tensor q_copy, k_copy, v_copy, bias_copy, sinks_copy;
};
using F32Inputs = HostInputs;  // as_f32_inputs: float views
using F64Inputs = HostInputs;  // as_f64_inputs: double views
F32Inputs as_f32_inputs(const AttentionInputs& in, const TokenPositions& pos);
F64Inputs as_f64_inputs(const AttentionInputs& in, const TokenPositions& pos);

// A contiguous f32 (f64) host copy of a host tensor of rank up to 4, any float dtype and strides.
Tensor f32_copy(const TensorView& t);
Tensor f64_copy(const TensorView& t);

}  // namespace ra
