// The logit of one (query row, key row) pair on the GPU with every option applied, in natural-log
// units: visibility (positions, segment ids, mask), the scaled dot product, soft cap and bias; -inf
// when hidden. The device twin of attention/pair_logit.h, shared by the sdpa kernel and the flash
// kernel's extras path so that both define a logit the same way; and the pieces the flash kernels take
// one at a time (bias and mask, dropout).
#pragma once

#include <cmath>
#include <cstdint>

#include "attention/cuda/cuda_inputs.h"
#include "attention/online_softmax.h"

namespace ra {

// The bias and boolean mask tensors at one pair (query row `row`, key position kpos) of (batch b, head h):
// false when the mask hides the pair, else true with the bias (0 without one) in `bias`.
__device__ __forceinline__ bool pair_bias_mask(const CudaAttentionArgs& a, int b, int h, int row, int64_t kpos, float& bias) {
  if (a.mask.data && static_cast<const uint8_t*>(a.mask.data)[b * a.mask.stride[0] + h * a.mask.stride[1] +
                                                              row * a.mask.stride[2] + kpos * a.mask.stride[3]] == 0)
    return false;
  bias = a.bias.data ? static_cast<const float*>(a.bias.data)[b * a.bias.stride[0] + h * a.bias.stride[1] +
                                                               row * a.bias.stride[2] + kpos * a.bias.stride[3]]
                     : 0.0f;
  return true;
}

// What dropout makes of one pair's probability: 0 where dropped, else keep_scale = 1 / (1 - p); 1
// without dropout. The decision is the forward's and the backward's alike (global positions only).
__device__ __forceinline__ float dropout_weight(const CudaAttentionArgs& a, int b, int h, int64_t qpos, int64_t kpos,
                                                float keep_scale) {
  if (a.dropout_prob <= 0.0f) return 1.0f;
  return dropout_drops(a.dropout_seed, a.batch_offset + b, a.head_offset + h, qpos, kpos, a.dropout_prob) ? 0.0f
                                                                                                    : keep_scale;
}

// `dot` is q.k of query row `row` and key row `col` of (batch b, head h).
__device__ __forceinline__ float pair_logit_cuda(const CudaAttentionArgs& a, float dot, int b, int h, int row, int col,
                                                 int64_t qpos, int64_t kpos) {
  bool visible = position_visible(qpos, kpos, a.causal, a.window_left, a.window_right);
  if (visible && a.q_segment_ids.data)
    visible = static_cast<const int32_t*>(a.q_segment_ids.data)[b * a.q_segment_ids.stride[0] + row * a.q_segment_ids.stride[1]] ==
              static_cast<const int32_t*>(a.kv_segment_ids.data)[b * a.kv_segment_ids.stride[0] + col * a.kv_segment_ids.stride[1]];
  float bias = 0.0f;
  if (!visible || !pair_bias_mask(a, b, h, row, kpos, bias)) return -INFINITY;
  float logit = dot * a.scale;
  if (a.soft_cap > 0.0f) logit = a.soft_cap * tanhf(logit / a.soft_cap);
  return logit + bias;
}

}  // namespace ra
