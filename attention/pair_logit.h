// The logit of one (query row, key row) pair with every option applied, in the accumulation type:
// visibility (positions, segment ids, mask), scaled dot product, soft cap, bias; -inf when hidden.
// Shared by the scalar CPU kernels (sdpa, the f64 reference, the exact-sum ring) so that all of them
// define a logit the same way.
#pragma once

#include <cmath>
#include <limits>

#include "attention/inputs.h"
#include "attention/online_softmax.h"
#include "attention/params.h"
#include "attention/validate.h"

namespace ra {

// `q` points at row t of head h; kh is h's K/V head. `in` holds views in the arithmetic's type (f32 for the
// kernels, f64 for the reference).
template <typename Acc>
Acc pair_logit(const HostInputs& in, const TokenPositions& pos, const AttentionParams& p, Acc scale, const Acc* q,
               int64_t b, int64_t h, int64_t kh, int64_t t, int64_t j) {
  const int64_t kpos = pos.k[size_t(j)];
  bool visible = position_visible(pos.q[size_t(t)], kpos, p.causal, p.window_left, p.window_right);
  if (visible && in.q_segment_ids.defined())
    visible = in.q_segment_ids.data_as<int32_t>()[b * in.q_segment_ids.stride(0) + t * in.q_segment_ids.stride(1)] ==
              in.kv_segment_ids.data_as<int32_t>()[b * in.kv_segment_ids.stride(0) + j * in.kv_segment_ids.stride(1)];
  if (visible && in.mask.defined())
    visible = in.mask.data_as<uint8_t>()[b * in.mask.stride(0) + h * in.mask.stride(1) + t * in.mask.stride(2) +
                                         kpos * in.mask.stride(3)] != 0;
  if (!visible) return -std::numeric_limits<Acc>::infinity();
  const Acc* k = in.k.data_as<Acc>() + b * in.k.stride(0) + j * in.k.stride(1) + kh * in.k.stride(2);
  const int64_t D = in.q.dim(3);
  Acc s = 0;
  for (int64_t d = 0; d < D; ++d) s += Acc(q[d]) * Acc(k[d]);
  s *= scale;
  const Acc cap = p.logits_soft_cap;
  if (cap > 0) s = cap * std::tanh(s / cap);
  if (in.bias.defined())
    s += in.bias.data_as<Acc>()[b * in.bias.stride(0) + h * in.bias.stride(1) + t * in.bias.stride(2) +
                                  kpos * in.bias.stride(3)];
  return s;
}

}  // namespace ra

namespace ra {

// The weight of probability `e` in the output under dropout: 0 when dropped, e / (1 - p) when kept.
template <typename Acc>
Acc dropout_weight(const AttentionParams& p, Acc keep_scale, Acc e, int64_t b, int64_t h, int64_t qpos, int64_t kpos) {
  if (p.dropout_prob <= 0) return e;
  return dropout_drops(p.dropout_seed, p.batch_offset + b, p.head_offset + h, qpos, kpos, p.dropout_prob) ? Acc(0)
                                                                                                     : e * keep_scale;
}

}  // namespace ra
