// Checks an attention call once, at the public boundary: every message names the tensor, the
// dimension and what was expected. Inner kernels assume what this establishes.
#pragma once

#include "attention/inputs.h"
#include "attention/params.h"

namespace ra {

// `max_head_dim`: the largest D / Dv the implementation supports.
void validate_attention(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                        int64_t max_head_dim);

// The inputs as the CPU kernels read them: q, k, v in f32 with a contiguous last dimension (converted
// copies of f16 / bf16 inputs are kept here), bias and mask broadcast to (B, Hq, T, S_total).
struct F32Inputs {
  TensorView q, k, v, bias, mask, sinks, q_segment_ids, kv_segment_ids;
  Tensor q_copy, k_copy, v_copy;
};
F32Inputs as_f32_inputs(const AttentionInputs& in, const TokenPositions& pos);

// A contiguous f32 host copy of a host tensor of rank up to 4, any float dtype and strides.
Tensor f32_copy(const TensorView& t);

}  // namespace ra
