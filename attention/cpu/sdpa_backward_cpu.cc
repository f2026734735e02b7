// CPU scaled-dot-product attention backward, one template over the accumulation type (float for the
// implementation, double for the oracle), as the forward, and over the sums' type (the accumulation
// type, or fixed point for the deterministic ring: each f64 term rounded on its own, integer sums).
// Each row's probabilities are recomputed from its final LSE, so no T x S matrix is kept. Parallel over
// (batch, K/V head): a thread owns the dK / dV rows of its head and the dQ rows of the query heads of its
// group, and the dBias elements of those (a broadcast bias's shared ones by taking every sharer in order).
#include <atomic>
#include <cmath>
#include <vector>

#include "attention/cpu/exact_backward_cpu.h"
#include "attention/cpu/sdpa_cpu.h"
#include "attention/online_softmax.h"
#include "attention/pair_logit.h"
#include "attention/validate.h"

namespace ra {
namespace {

// Acc: the terms' arithmetic; LseT: LSE and delta as stored; Sum: the sums; LogitT: the logits' arithmetic
// and the inputs' type (the deterministic ring's f64 terms take f32 logits, as its forward's LSE was
// computed from).
template <typename Acc, typename LseT = Acc, typename Sum = Acc, typename LogitT = Acc>
struct BackwardBuffers {
  const LogitT* d_o;  // (B, T, Hq, Dv) contiguous
  const LseT* lse;    // (B, Hq, T)
  const LseT* delta;  // (B, Hq, T)
  Sum *dq, *dk, *dv;  // contiguous, shaped as q, k, v
  Sum* dbias;         // nullptr without a bias; else indexed with dbias_strides over (B, Hq, T, S_total)
  std::array<int64_t, kMaxRank> dbias_strides{};
  FixedUnits units{};                         // fixed-point sums only: each output's unit
  std::atomic<bool>* out_of_range = nullptr;  // fixed-point sums only: set when a term exceeds its range
  // The oracle only (kTerms): each output's sum of |terms| (shaped as dq, dk, dv, dbias), and per row
  // sum |dO * O|, delta's.
  double *dq_terms = nullptr, *dk_terms = nullptr, *dv_terms = nullptr, *dbias_terms = nullptr;
  const double* delta_terms = nullptr;
};

// sum += term: as is for floating-point sums; for fixed point, rounded to `unit` on its own.
template <typename Acc>
void add_term(Acc& sum, Acc term, double, std::atomic<bool>*) {
  sum += term;
}
inline void add_term(Fixed& sum, double term, double unit, std::atomic<bool>* out_of_range) {
  if (!fixed_add(sum, term, unit)) out_of_range->store(true, std::memory_order_relaxed);
}

template <bool kTerms = false, typename Acc, typename LseT, typename Sum, typename LogitT>
void sdpa_backward_rows(const HostInputs& in, const TokenPositions& pos, const AttentionParams& p,
                        const BackwardBuffers<Acc, LseT, Sum, LogitT>& buf) {
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), D = in.q.dim(3);
  const int64_t S = in.k.dim(1), Hkv = in.k.dim(2), Dv = in.v.dim(3), group = Hq / Hkv;
  const Acc scale = effective_scale(p, D), cap = p.logits_soft_cap;
  const LogitT logit_scale = effective_scale(p, D);
  const Acc keep_scale = Acc(1) / (Acc(1) - Acc(p.dropout_prob));
  // A thread takes a (batch, K/V head) unit; a broadcast bias's gradient shared across batch entries or K/V heads
  // makes those one unit, its members taken in order, so that every sum has one order on any run.
  const bool shared_b = buf.dbias != nullptr && buf.dbias_strides[0] == 0;
  const bool shared_h = buf.dbias != nullptr && buf.dbias_strides[1] == 0;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t unit_b = 0; unit_b < (shared_b ? 1 : B); ++unit_b)
    for (int64_t unit_h = 0; unit_h < (shared_h ? 1 : Hkv); ++unit_h)
      for (int64_t b = unit_b; b < (shared_b ? B : unit_b + 1); ++b)
        for (int64_t kh = unit_h; kh < (shared_h ? Hkv : unit_h + 1); ++kh) {
          std::vector<Sum> dq_row(static_cast<size_t>(D));
          std::vector<double> dq_terms_row(kTerms ? size_t(D) : 0);
          for (int64_t h = kh * group; h < (kh + 1) * group; ++h)
            for (int64_t t = 0; t < T; ++t) {
              const int64_t r = (b * Hq + h) * T + t;
              const Acc lse = Acc(buf.lse[r]), delta = Acc(buf.delta[r]);
              if (lse == -INFINITY) continue;  // the row saw nothing: no gradient flows through it
              const LogitT* q = in.q.data_as<LogitT>() + b * in.q.stride(0) + t * in.q.stride(1) + h * in.q.stride(2);
              const LogitT* d_o = buf.d_o + ((b * T + t) * Hq + h) * Dv;
              std::fill(dq_row.begin(), dq_row.end(), Sum(0));
              std::fill(dq_terms_row.begin(), dq_terms_row.end(), 0.0);
              for (int64_t j = 0; j < S; ++j) {
                const Acc s = pair_logit<LogitT>(in, pos, p, logit_scale, q, b, h, kh, t, j);
                if (s == -INFINITY) continue;
                const int64_t kpos = pos.k[size_t(j)];
                // P <= 1: LSE bounds every logit of its row, but a rounded LSE (f32, of logits far from 0) may
                // sit an ulp below the largest one.
                const Acc prob = std::exp(std::fmin(s - lse, Acc(0)));
                const Acc weight = dropout_weight(p, keep_scale, Acc(1), b, h, pos.q[size_t(t)], kpos);
                const LogitT* v =
                    in.v.data_as<LogitT>() + b * in.v.stride(0) + j * in.v.stride(1) + kh * in.v.stride(2);
                Sum* dv = buf.dv + ((b * S + j) * Hkv + kh) * Dv;
                [[maybe_unused]] double* dv_terms = kTerms ? buf.dv_terms + (dv - buf.dv) : nullptr;
                Acc dp = 0;
                double dp_terms = 0;
                for (int64_t d = 0; d < Dv; ++d) {
                  dp += Acc(d_o[d]) * Acc(v[d]);
                  add_term(dv[d], prob * weight * Acc(d_o[d]), buf.units.dv, buf.out_of_range);
                  if constexpr (kTerms) {
                    dp_terms += std::fabs(double(d_o[d]) * double(v[d]));
                    dv_terms[d] += std::fabs(double(prob * weight * Acc(d_o[d])));
                  }
                }
                const Acc ds = prob * (dp * weight - delta);  // d loss / d logit
                // |dS|'s terms: P (|dP| weight + |delta|), each of dP and delta from its own sum of |products|.
                [[maybe_unused]] const double ds_terms =
                    kTerms ? double(prob) * (dp_terms * std::fabs(double(weight)) + buf.delta_terms[r]) : 0.0;
                const int64_t bias_at = b * buf.dbias_strides[0] + h * buf.dbias_strides[1] + t * buf.dbias_strides[2] +
                                        kpos * buf.dbias_strides[3];
                if (buf.dbias != nullptr) {  // this unit's alone (above)
                  if constexpr (kTerms) buf.dbias_terms[bias_at] += ds_terms;
                  add_term(buf.dbias[bias_at], ds, buf.units.dbias, buf.out_of_range);
                }
                Acc dx = ds * scale;  // through the soft cap: d(cap tanh(x / cap)) / dx = 1 - tanh^2
                [[maybe_unused]] double dx_terms = ds_terms * double(scale);
                if (cap > 0) {
                  const Acc capped = in.bias.defined() ? s - Acc(in.bias.data_as<LogitT>()[b * in.bias.stride(0) +
                                                                                         h * in.bias.stride(1) +
                                                                                         t * in.bias.stride(2) +
                                                                                         kpos * in.bias.stride(3)])
                                                       : s;
                  const Acc th = capped / cap;
                  dx *= Acc(1) - th * th;
                  dx_terms *= std::fabs(double(Acc(1) - th * th));
                }
                const LogitT* k =
                    in.k.data_as<LogitT>() + b * in.k.stride(0) + j * in.k.stride(1) + kh * in.k.stride(2);
                Sum* dk = buf.dk + ((b * S + j) * Hkv + kh) * D;
                for (int64_t d = 0; d < D; ++d) {
                  add_term(dq_row[size_t(d)], dx * Acc(k[d]), buf.units.dq, buf.out_of_range);
                  add_term(dk[d], dx * Acc(q[d]), buf.units.dk, buf.out_of_range);
                }
                if constexpr (kTerms) {
                  double* dk_terms = buf.dk_terms + (dk - buf.dk);
                  for (int64_t d = 0; d < D; ++d) {
                    dq_terms_row[size_t(d)] += dx_terms * std::fabs(double(k[d]));
                    dk_terms[d] += dx_terms * std::fabs(double(q[d]));
                  }
                }
              }
              Sum* dq = buf.dq + ((b * T + t) * Hq + h) * D;
              for (int64_t d = 0; d < D; ++d) dq[d] += dq_row[size_t(d)];
              if constexpr (kTerms)
                for (int64_t d = 0; d < D; ++d) buf.dq_terms[(dq - buf.dq) + d] += dq_terms_row[size_t(d)];
            }
        }
}

}  // namespace

void sdpa_accumulate_backward_cpu(const AttentionInputs& in_raw, const TokenPositions& pos, const AttentionParams& p,
                                  const BackwardInputs& grad, const GradViews& acc) {
  const F32Inputs in = as_f32_inputs(in_raw, pos);
  const Tensor d_o = f32_copy(grad.d_o);
  BackwardBuffers<float> buf{d_o.data<float>(),     grad.lse.data_as<float>(), grad.delta.data_as<float>(),
                             acc.dq.data_as<float>(), acc.dk.data_as<float>(),  acc.dv.data_as<float>(),
                             acc.dbias.data_as<float>()};
  // A strided view (a blockwise chunk of a larger accumulator) keeps its own strides.
  if (acc.dbias.defined()) buf.dbias_strides = dbias_over_pairs(acc.dbias, in_raw, pos.total_keys).strides();
  sdpa_backward_rows(in, pos, p, buf);
}

bool sdpa_accumulate_backward_fixed(const AttentionInputs& in_raw, const TokenPositions& pos, const AttentionParams& p,
                                    const BackwardInputs& grad, const FixedGradViews& acc) {
  const F32Inputs in = as_f32_inputs(in_raw, pos);
  const Tensor d_o = f32_copy(grad.d_o);
  std::atomic<bool> out_of_range{false};
  BackwardBuffers<double, float, Fixed, float> buf{d_o.data<float>(), grad.lse.data_as<float>(),
                                                   grad.delta.data_as<float>(), acc.dq, acc.dk, acc.dv, acc.dbias};
  buf.units = acc.units;
  buf.out_of_range = &out_of_range;
  if (acc.dbias != nullptr)  // strides from the bias's shape (the sums are contiguous in it)
    buf.dbias_strides = dbias_over_pairs(TensorView(acc.dbias, DType::kF32, in_raw.bias.shape()), in_raw, pos.total_keys).strides();
  sdpa_backward_rows(in, pos, p, buf);
  return !out_of_range.load();
}

ReferenceGradients reference_attention_backward_f64(const AttentionInputs& in_raw, const AttentionParams& p,
                                                    const TokenPositions& pos, const TensorView& d_o_raw,
                                                    bool with_terms, const TensorView& d_lse_raw) {
  const F64Inputs in = as_f64_inputs(in_raw, pos);
  const Tensor d_o = f64_copy(d_o_raw);
  const Tensor d_lse = d_lse_raw.defined() ? f64_copy(d_lse_raw) : Tensor();  // (B, Hq, T)
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), D = in.q.dim(3);
  const int64_t S = in.k.dim(1), Hkv = in.k.dim(2), Dv = in.v.dim(3);
  ReferenceGradients g;
  g.forward = reference_attention_f64(in_raw, p, pos);
  std::vector<double> delta(size_t(B * Hq * T)), delta_terms(delta.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t row = ((b * T + t) * Hq + h) * Dv;
        double sum = 0, terms = 0;
        for (int64_t d = 0; d < Dv; ++d) {
          const double product = g.forward.o[size_t(row + d)] * d_o.data<double>()[row + d];
          sum += product;
          terms += std::fabs(product);
        }
        const int64_t r = (b * Hq + h) * T + t;
        const double lse_gradient = d_lse.defined() ? d_lse.data<double>()[r] : 0.0;
        delta[size_t(r)] = sum - lse_gradient;  // dS = P (dP - delta + dLSE)
        delta_terms[size_t(r)] = terms + std::fabs(lse_gradient);
      }
  g.dq.assign(size_t(B * T * Hq * D), 0.0);
  g.dk.assign(size_t(B * S * Hkv * D), 0.0);
  g.dv.assign(size_t(B * S * Hkv * Dv), 0.0);
  BackwardBuffers<double> buf{d_o.data<double>(), g.forward.lse.data(), delta.data(), g.dq.data(), g.dk.data(),
                              g.dv.data(),       nullptr};
  if (with_terms) {
    g.dq_terms.assign(g.dq.size(), 0.0);
    g.dk_terms.assign(g.dk.size(), 0.0);
    g.dv_terms.assign(g.dv.size(), 0.0);
    buf.dq_terms = g.dq_terms.data(), buf.dk_terms = g.dk_terms.data(), buf.dv_terms = g.dv_terms.data();
    buf.delta_terms = delta_terms.data();
  }
  if (in_raw.bias.defined()) {
    g.dbias.assign(size_t(in_raw.bias.numel()), 0.0);
    buf.dbias = g.dbias.data();
    buf.dbias_strides = dbias_over_pairs(TensorView(buf.dbias, DType::kF64, in_raw.bias.shape()), in_raw, pos.total_keys).strides();
    if (with_terms) {
      g.dbias_terms.assign(g.dbias.size(), 0.0);
      buf.dbias_terms = g.dbias_terms.data();
    }
  }
  if (with_terms) sdpa_backward_rows<true>(in, pos, p, buf);
  else sdpa_backward_rows<false>(in, pos, p, buf);
  if (in.sinks.defined()) {
    g.dsinks.assign(size_t(Hq), 0.0);
    if (with_terms) g.dsinks_terms.assign(size_t(Hq), 0.0);
    for (int64_t h = 0; h < Hq; ++h) {
      const double sink = in.sinks.data_as<double>()[h * in.sinks.stride(0)];
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t r = (b * Hq + h) * T + t;
          const double lse = g.forward.lse[size_t(r)];
          if (lse == -INFINITY) continue;
          g.dsinks[size_t(h)] -= std::exp(sink - lse) * delta[size_t(r)];
          if (with_terms) g.dsinks_terms[size_t(h)] += std::exp(sink - lse) * delta_terms[size_t(r)];
        }
    }
  }
  return g;
}

}  // namespace ra
