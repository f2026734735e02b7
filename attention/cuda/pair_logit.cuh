// The logit of one (query row, key row) pair on the GPU with every option applied, in natural-log
// units: visibility (positions, segment ids, mask), the scaled dot product, soft cap and bias; -inf
// when hidden. The device twin of attention/pair_logit.h, shared by the sdpa kernel and the flash
// kernel's extras path so that both define a logit the same way.
#pragma once

#include <cmath>
#include <cstdint>

#include "attention/cuda/cuda_inputs.h"
#include "attention/online_softmax.h"

namespace ra {

// `dot` is q.k of query row `row` and key row `col` of (batch b, head h).
__device__ __forceinline__ float pair_logit_cuda(const CudaAttentionArgs& a, float dot, int b, int h, int row, int col,
                                                 int64_t qpos, int64_t kpos) {
  bool visible = position_visible(qpos, kpos, a.causal, a.window_left, a.window_right);
  if (visible && a.q_segment_ids.data)
    visible = static_cast<const int32_t*>(a.q_segment_ids.data)[b * a.q_segment_ids.stride[0] + row * a.q_segment_ids.stride[1]] ==
              static_cast<const int32_t*>(a.kv_segment_ids.data)[b * a.kv_segment_ids.stride[0] + col * a.kv_segment_ids.stride[1]];
  if (visible && a.mask.data)
    visible = static_cast<const uint8_t*>(a.mask.data)[b * a.mask.stride[0] + h * a.mask.stride[1] + row * a.mask.stride[2] +
                                                        kpos * a.mask.stride[3]] != 0;
  if (!visible) return -INFINITY;
  float logit = dot * a.scale;
  if (a.soft_cap > 0.0f) logit = a.soft_cap * tanhf(logit / a.soft_cap);
  if (a.bias.data)
    logit += static_cast<const float*>(a.bias.data)[b * a.bias.stride[0] + h * a.bias.stride[1] + row * a.bias.stride[2] +
                                                     kpos * a.bias.stride[3]];
  return logit;
}

}  // namespace ra
