// CPU scaled-dot-product attention, one template over the accumulation type (float for the
// implementation, double for the oracle), parallel over (batch, head).
#include "attention/cpu/sdpa_cpu.h"

#include <cmath>
#include <limits>

#include "attention/online_softmax.h"
#include "attention/pair_logit.h"
#include "attention/validate.h"

namespace ra {
namespace {

// Calls sink(b, h, t, max, sum, o) with the softmax statistics and unnormalised output of each row.
template <typename Acc, typename RowSink>
void sdpa_rows(const HostInputs& in, const TokenPositions& pos, const AttentionParams& p, const RowSink& sink) {
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), D = in.q.dim(3);
  const int64_t S = in.k.dim(1), Hkv = in.k.dim(2), Dv = in.v.dim(3), group = Hq / Hkv;
  const Acc scale = effective_scale(p, D);
  const Acc keep_scale = Acc(1) / (Acc(1) - Acc(p.dropout_prob));
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / group;
      std::vector<Acc> scores(static_cast<size_t>(S)), o(static_cast<size_t>(Dv));
      for (int64_t t = 0; t < T; ++t) {
        const Acc* q = in.q.data_as<Acc>() + b * in.q.stride(0) + t * in.q.stride(1) + h * in.q.stride(2);
        Acc m = neg_inf;
        for (int64_t j = 0; j < S; ++j) {
          scores[size_t(j)] = pair_logit<Acc>(in, pos, p, scale, q, b, h, kh, t, j);
          m = std::fmax(m, scores[size_t(j)]);
        }
        Acc l = m == neg_inf ? unseen_row_sum<Acc>(scores.data(), S) : Acc(0);
        std::fill(o.begin(), o.end(), Acc(0));
        if (m != neg_inf) {
          for (int64_t j = 0; j < S; ++j) {
            if (scores[size_t(j)] == neg_inf) continue;
            const Acc e = std::exp(scores[size_t(j)] - m);
            const Acc w = dropout_weight(p, keep_scale, e, b, h, pos.q[size_t(t)], pos.k[size_t(j)]);
            l += e;
            const Acc* v = in.v.data_as<Acc>() + b * in.v.stride(0) + j * in.v.stride(1) + kh * in.v.stride(2);
            for (int64_t d = 0; d < Dv; ++d) o[size_t(d)] += w * v[d];
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
    SoftmaxState<float> state{mx[r], den[r]};
    const auto [a, c] = softmax_merge(state, {m, l});
    for (int64_t d = 0; d < Dv; ++d) num[r * Dv + d] = num[r * Dv + d] * a + o[d] * c;
    mx[r] = state.max;
    den[r] = state.sum;
  });
}

ReferenceOutput reference_attention_f64(const AttentionInputs& in_raw, const AttentionParams& p,
                                        const TokenPositions& pos) {
  const F64Inputs in = as_f64_inputs(in_raw, pos);
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), Dv = in.v.dim(3);
  ReferenceOutput out{std::vector<double>(size_t(B * T * Hq * Dv)), std::vector<double>(size_t(B * Hq * T))};
  sdpa_rows<double>(in, pos, p, [&](int64_t b, int64_t h, int64_t t, double m, double l, const double* o) {
    const double sink = in.sinks.defined() ? in.sinks.data_as<double>()[h * in.sinks.stride(0)] : 0.0;
    const auto [scale, lse] = softmax_normalize(SoftmaxState<double>{m, l}, in.sinks.defined(), sink);
    double* dst = &out.o[size_t(((b * T + t) * Hq + h) * Dv)];
    for (int64_t d = 0; d < Dv; ++d) dst[d] = o[d] * scale;
    out.lse[size_t((b * Hq + h) * T + t)] = lse;
  });
  return out;
}

}  // namespace ra
