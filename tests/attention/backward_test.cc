// The backward pass. First the oracle: the f64 reference's gradients against central finite
// differences of a dense f64 attention written here, independently of pair_logit and sdpa (so a
// mistake the two share cannot pass). Then every CPU implementation x dtype x option against the
// oracle on randomised shapes, block splitting, closed forms and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "attention/online_softmax.h"
#include "attention/registry.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "tests/support/problem.h"

namespace ra::test {
namespace {

std::vector<double> as_doubles(const TensorView& t) {
  std::vector<double> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = load_as_f32(t.data(), t.dtype(), size_t(i));
  return out;
}

// Every input of a tiny problem as f64 values, perturbable one at a time.
struct DenseProblem {
  int64_t B, T, S, Hq, Hkv, D, Dv;
  std::vector<double> q, k, v, bias, sinks, d_o;  // bias (1, Hq, T, S) as Problem makes it
  const Problem* source;
};

// Attention written out from its definition: logits scale * q.k, soft cap, bias, hidden pairs (causal
// aligned bottom-right, window, mask, segments) left out of the softmax, the sink as one more term of
// the denominator, dropout on the probabilities. Returns loss = sum(dO * O).
double dense_loss(const DenseProblem& p) {
  const Problem& src = *p.source;
  const AttentionParams& a = src.params();
  // The scale is a float parameter (1/sqrt(D) rounded to f32), as every implementation takes it.
  const double scale = 1.0f / std::sqrt(float(p.D)), keep = 1.0 / (1.0 - double(a.dropout_prob));
  double loss = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t t = 0; t < p.T; ++t) {
        const int64_t kh = h / (p.Hq / p.Hkv), qpos = t + p.S - p.T;
        std::vector<double> logit(size_t(p.S));
        std::vector<bool> seen(size_t(p.S), false);
        double top = p.sinks.empty() ? -INFINITY : p.sinks[size_t(h)];
        for (int64_t j = 0; j < p.S; ++j) {
          bool ok = !(a.causal && j > qpos);
          if (a.window_left >= 0 && j < qpos - a.window_left) ok = false;
          if (a.window_right >= 0 && j > qpos + a.window_right) ok = false;
          if (src.mask.defined() && src.mask.data<uint8_t>()[(b * p.T + t) * p.S + j] == 0) ok = false;
          if (src.q_seg.defined() && src.q_seg.data<int32_t>()[b * p.T + t] != src.kv_seg.data<int32_t>()[b * p.S + j])
            ok = false;
          if (!ok) continue;
          double x = 0;
          for (int64_t d = 0; d < p.D; ++d)
            x += p.q[size_t(((b * p.T + t) * p.Hq + h) * p.D + d)] * p.k[size_t(((b * p.S + j) * p.Hkv + kh) * p.D + d)];
          x *= scale;
          if (a.logits_soft_cap > 0) x = a.logits_soft_cap * std::tanh(x / a.logits_soft_cap);
          if (!p.bias.empty()) x += p.bias[size_t((h * p.T + t) * p.S + j)];
          logit[size_t(j)] = x;
          seen[size_t(j)] = true;
          top = std::max(top, x);
        }
        if (top == -INFINITY) continue;  // nothing to attend: O = 0
        double denominator = p.sinks.empty() ? 0.0 : std::exp(p.sinks[size_t(h)] - top);
        for (int64_t j = 0; j < p.S; ++j)
          if (seen[size_t(j)]) denominator += std::exp(logit[size_t(j)] - top);
        for (int64_t j = 0; j < p.S; ++j) {
          if (!seen[size_t(j)]) continue;
          double weight = std::exp(logit[size_t(j)] - top) / denominator;
          if (a.dropout_prob > 0)
            weight *= dropout_uniform(a.dropout_seed, b, h, qpos, j) < a.dropout_prob ? 0.0 : keep;
          for (int64_t d = 0; d < p.Dv; ++d)
            loss += weight * p.v[size_t(((b * p.S + j) * p.Hkv + kh) * p.Dv + d)] *
                    p.d_o[size_t(((b * p.T + t) * p.Hq + h) * p.Dv + d)];
        }
      }
  return loss;
}

// Central differences of dense_loss with respect to every element of `x`.
std::vector<double> finite_differences(DenseProblem& p, std::vector<double>& x) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i], h = 1e-5 * std::max(1.0, std::fabs(keep));
    x[i] = keep + h;
    const double up = dense_loss(p);
    x[i] = keep - h;
    const double down = dense_loss(p);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / std::max(1.0, std::fabs(want[i])));
  EXPECT_LT(worst, 2e-6) << what;
}

class OracleGradients : public testing::TestWithParam<Options> {};

TEST_P(OracleGradients, MatchFiniteDifferencesOfAnIndependentDenseAttention) {
  for (auto [T, S] : {std::pair{5, 7}, std::pair{6, 6}, std::pair{1, 4}}) {
    ProblemSpec spec{2, T, S, 4, 2, 3, 2, DType::kF32, GetParam(), uint64_t(T * 100 + S)};
    Problem problem(spec);
    std::mt19937_64 rng(spec.seed + 1);
    const Tensor d_o = random_normal(DType::kF32, {2, T, 4, 2}, rng, 1.0f);
    DenseProblem p{2, T, S, 4, 2, 3, 2, as_doubles(problem.q), as_doubles(problem.k), as_doubles(problem.v), {}, {},
                   as_doubles(d_o), &problem};
    if (problem.bias.defined()) p.bias = as_doubles(problem.bias);
    if (problem.sinks.defined()) p.sinks = as_doubles(problem.sinks);
    const AttentionInputs in = problem.inputs();
    const TokenPositions pos = TokenPositions::dense(T, S);
    const ReferenceGradients ref = reference_attention_backward_f64(in, problem.params(), pos, d_o);
    // The oracle's forward is the written-out one: loss = sum(dO * O).
    double loss = 0;
    for (size_t i = 0; i < ref.forward.o.size(); ++i) loss += ref.forward.o[i] * p.d_o[i];
    EXPECT_NEAR(loss, dense_loss(p), 1e-10 * std::max(1.0, std::fabs(loss)));
    expect_close(ref.dq, finite_differences(p, p.q), "dq");
    expect_close(ref.dk, finite_differences(p, p.k), "dk");
    expect_close(ref.dv, finite_differences(p, p.v), "dv");
    if (!p.bias.empty()) expect_close(ref.dbias, finite_differences(p, p.bias), "dbias");
    if (!p.sinks.empty()) expect_close(ref.dsinks, finite_differences(p, p.sinks), "dsinks");
  }
}

INSTANTIATE_TEST_SUITE_P(F64, OracleGradients, testing::ValuesIn(option_sets()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace ra::test
