// CPU scaled-dot-product attention, one template over the accumulation type (float for the
// implementation, double for the oracle), parallel over (batch, head).
#include "attention/sdpa_cpu.h"

#include <cmath>
#include <limits>

#include "attention/online_softmax.h"
#include "attention/validate.h"

namespace ra {
namespace {

// Calls sink(b, h, t, max, sum, o) with the softmax statistics and unnormalised output of each row.
template <typename Acc, typename RowSink>
void sdpa_rows(const F32Inputs& in, const TokenPositions& pos, const AttentionParams& p, const RowSink& sink) {
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), D = in.q.dim(3);
  const int64_t S = in.k.dim(1), Hkv = in.k.dim(2), Dv = in.v.dim(3), group = Hq / Hkv;
  const Acc scale = effective_scale(p, D), cap = p.logits_soft_cap;
  const Acc keep_scale = Acc(1) / (Acc(1) - Acc(p.dropout_prob));
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / group;
      std::vector<Acc> scores(static_cast<size_t>(S)), o(static_cast<size_t>(Dv));
      for (int64_t t = 0; t < T; ++t) {
        const float* q = in.q.data_as<float>() + b * in.q.stride(0) + t * in.q.stride(1) + h * in.q.stride(2);
        Acc m = neg_inf;
        for (int64_t j = 0; j < S; ++j) {
          const int64_t kpos = pos.k[size_t(j)];
          bool visible = position_visible(pos.q[size_t(t)], kpos, p.causal, p.window_left, p.window_right);
          if (visible && in.q_segment_ids.defined())
            visible = in.q_segment_ids.data_as<int32_t>()[b * in.q_segment_ids.stride(0) + t * in.q_segment_ids.stride(1)] ==
                      in.kv_segment_ids.data_as<int32_t>()[b * in.kv_segment_ids.stride(0) + j * in.kv_segment_ids.stride(1)];
          if (visible && in.mask.defined())
            visible = in.mask.data_as<uint8_t>()[b * in.mask.stride(0) + h * in.mask.stride(1) + t * in.mask.stride(2) +
                                                 kpos * in.mask.stride(3)] != 0;
          scores[size_t(j)] = neg_inf;
          if (!visible) continue;
          const float* k = in.k.data_as<float>() + b * in.k.stride(0) + j * in.k.stride(1) + kh * in.k.stride(2);
          Acc s = 0;
          for (int64_t d = 0; d < D; ++d) s += Acc(q[d]) * Acc(k[d]);
          s *= scale;
          if (cap > 0) s = cap * std::tanh(s / cap);
          if (in.bias.defined())
            s += in.bias.data_as<float>()[b * in.bias.stride(0) + h * in.bias.stride(1) + t * in.bias.stride(2) +
                                          kpos * in.bias.stride(3)];
          scores[size_t(j)] = s;
          m = std::fmax(m, s);
        }
        Acc l = 0;
        std::fill(o.begin(), o.end(), Acc(0));
        if (m != neg_inf) {
          for (int64_t j = 0; j < S; ++j) {
            if (scores[size_t(j)] == neg_inf) continue;
            Acc e = std::exp(scores[size_t(j)] - m), w = e;
            l += e;
            if (p.dropout_prob > 0)
              w = dropout_uniform(p.dropout_seed, b, h, pos.q[size_t(t)], pos.k[size_t(j)]) < p.dropout_prob
                      ? Acc(0) : e * keep_scale;
            const float* v = in.v.data_as<float>() + b * in.v.stride(0) + j * in.v.stride(1) + kh * in.v.stride(2);
            for (int64_t d = 0; d < Dv; ++d) o[size_t(d)] += w * Acc(v[d]);
          }
        }
        sink(b, h, t, m, l, o.data());
      }
    }
}

}  // namespace

void sdpa_accumulate_cpu(const AttentionInputs& in_raw, const TokenPositions& pos, const AttentionParams& p,
                         Carry& carry) {
  F32Inputs in = as_f32_inputs(in_raw, pos);
  const int64_t Hq = carry.heads, T = carry.rows, Dv = carry.value_dim;
  float* num = carry.numerator.data<float>();
  float* den = carry.denominator.data<float>();
  float* mx = carry.max.data<float>();
  sdpa_rows<float>(in, pos, p, [&](int64_t b, int64_t h, int64_t t, float m, float l, const float* o) {
    const int64_t r = (b * Hq + h) * T + t;
    const float m_new = std::fmax(mx[r], m);
    if (m_new == -INFINITY) return;  // nothing visible yet
    const float a = rescale_factor(mx[r], m_new), c = rescale_factor(m, m_new);
    den[r] = den[r] * a + l * c;
    for (int64_t d = 0; d < Dv; ++d) num[r * Dv + d] = num[r * Dv + d] * a + o[d] * c;
    mx[r] = m_new;
  });
}

ReferenceOutput reference_attention_f64(const AttentionInputs& in_raw, const AttentionParams& p,
                                        const TokenPositions& pos) {
  F32Inputs in = as_f32_inputs(in_raw, pos);
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), Dv = in.v.dim(3);
  ReferenceOutput out{std::vector<double>(size_t(B * T * Hq * Dv)), std::vector<double>(size_t(B * Hq * T))};
  sdpa_rows<double>(in, pos, p, [&](int64_t b, int64_t h, int64_t t, double m, double l, const double* o) {
    double scale_o = 1.0;
    if (in.sinks.defined()) {
      double s = in.sinks.data_as<float>()[h * in.sinks.stride(0)];
      double m2 = std::fmax(m, s);
      scale_o = m == -INFINITY ? 0.0 : std::exp(m - m2);
      l = l * scale_o + std::exp(s - m2);
      m = m2;
    }
    double* dst = &out.o[size_t(((b * T + t) * Hq + h) * Dv)];
    for (int64_t d = 0; d < Dv; ++d) dst[d] = l > 0 ? o[d] * scale_o / l : 0.0;
    out.lse[size_t((b * Hq + h) * T + t)] = l > 0 ? m + std::log(l) : -INFINITY;
  });
  return out;
}

}  // namespace ra
