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

// Dropout's head key and threshold formed once, for the extras instances: a pair then costs its row's key and a
// finalizer (half of one where the keys pair up), not also the 64-bit head key and the threshold formed again.
struct DropoutRows {
  uint32_t head_key = 0, threshold = 0;
  float keep_scale = 1.0f;
  bool on = false;  // a.dropout_prob > 0

  __device__ __forceinline__ uint32_t row_key(int64_t qpos) const { return dropout_row_key(head_key, qpos); }
  // The pair form's row key and threshold (dropout_pair_bits), where the keys pair up (dropout_pairs_keyed).
  __device__ __forceinline__ uint32_t folded_row_key(int64_t qpos) const { return mix32_fold(row_key(qpos)); }
  __device__ __forceinline__ uint32_t threshold_high() const { return dropout_threshold_high(threshold); }
  // dropout_weight's answer for the pair of `row_key`'s query and key position kpos.
  __device__ __forceinline__ float weight(uint32_t row_key, int64_t kpos) const {
    return on && dropout_drops(row_key, kpos, threshold) ? 0.0f : keep_scale;
  }
};

__device__ __forceinline__ DropoutRows dropout_rows(const CudaAttentionArgs& a, int b, int h) {
  DropoutRows rows;
  rows.on = a.dropout_prob > 0.0f;
  if (rows.on) {
    rows.head_key = dropout_head_key(a.dropout_seed, a.batch_offset + b, a.head_offset + h);
    rows.threshold = dropout_threshold(a.dropout_prob);
    rows.keep_scale = 1.0f / (1.0f - a.dropout_prob);
  }
  return rows;
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
