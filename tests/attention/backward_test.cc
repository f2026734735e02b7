// The backward pass. First the oracle: the f64 reference's gradients against central finite
// differences of a dense f64 attention written here, independently of pair_logit and sdpa (so a
// mistake the two share cannot pass). Then every CPU implementation x dtype x option against the
// oracle on randomised shapes, block splitting, closed forms and bad input.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <random>
#include <tuple>

#include "attention/compare.h"
#include "attention/cpu/flash_cpu.h"
#include "attention/online_softmax.h"
#include "attention/registry.h"
#include "attention/validate.h"
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
  std::vector<double> d_lse = {};  // (B, Hq, T): where the loss reads LSE too
};

// Attention written out from its definition: logits scale * q.k, soft cap, bias, hidden pairs (causal
// aligned bottom-right, window, mask, segments) left out of the softmax, the sink as one more term of
// the denominator, dropout on the probabilities. Returns loss = sum(dO * O) (+ sum(dLSE * LSE), LSE = log of
// the denominator before dropout).
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
        if (!p.d_lse.empty()) loss += p.d_lse[size_t((b * p.Hq + h) * p.T + t)] * (top + std::log(denominator));
        for (int64_t j = 0; j < p.S; ++j) {
          if (!seen[size_t(j)]) continue;
          double weight = std::exp(logit[size_t(j)] - top) / denominator;
          if (a.dropout_prob > 0)
            weight *= dropout_drops(a.dropout_seed, b, h, qpos, j, a.dropout_prob) ? 0.0 : keep;
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

// The same with a loss that reads LSE too: loss = sum(dO * O) + sum(dLSE * LSE).
TEST_P(OracleGradients, WithLseInTheLossMatchFiniteDifferences) {
  for (auto [T, S] : {std::pair{5, 7}, std::pair{1, 4}}) {
    ProblemSpec spec{2, T, S, 4, 2, 3, 2, DType::kF32, GetParam(), uint64_t(T * 100 + S)};
    Problem problem(spec);
    std::mt19937_64 rng(spec.seed + 2);
    const Tensor d_o = random_normal(DType::kF32, {2, T, 4, 2}, rng, 1.0f);
    const Tensor d_lse = random_normal(DType::kF32, {2, 4, T}, rng, 1.0f);
    DenseProblem p{2, T, S, 4, 2, 3, 2, as_doubles(problem.q), as_doubles(problem.k), as_doubles(problem.v), {}, {},
                   as_doubles(d_o), &problem, as_doubles(d_lse)};
    if (problem.bias.defined()) p.bias = as_doubles(problem.bias);
    if (problem.sinks.defined()) p.sinks = as_doubles(problem.sinks);
    const ReferenceGradients ref = reference_attention_backward_f64(problem.inputs(), problem.params(),
                                                                    TokenPositions::dense(T, S), d_o, true, d_lse);
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

namespace ra::test {
namespace {

struct GradCase {
  std::string impl;
  Backend backend;
  ProblemSpec spec;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.impl << "/" << backend_name(c.backend); }

std::string grad_case_name(const testing::TestParamInfo<GradCase>& info) {
  const GradCase& c = info.param;
  const ProblemSpec& s = c.spec;
  return c.impl + "_" + std::string(backend_name(c.backend)) + "_" + std::string(dtype_name(s.dtype)) + "_" +
         s.options.name() + "_T" + std::to_string(s.q_len) + "_S" + std::to_string(s.kv_len) + "_D" +
         std::to_string(s.head_dim) + "_G" + std::to_string(s.q_heads / s.kv_heads);
}

// Odd lengths, S != T, T = 1, D in {32, 64, 80, 128}, Dv != D, GQA 1/2/4/8.
std::vector<GradCase> cpu_grad_cases() {
  struct Shape {
    int64_t b, t, s, hq, hkv, d, dv;
  };
  const Shape shapes[] = {{2, 37, 37, 4, 4, 32, 32}, {1, 41, 67, 8, 4, 64, 64}, {1, 29, 50, 4, 1, 80, 48},
                          {1, 33, 21, 8, 1, 128, 128}, {2, 1, 45, 8, 2, 64, 64}, {1, 50, 43, 8, 8, 128, 80}};
  const std::pair<const char*, Backend> impls[] = {{"sdpa", Backend::kCpu},
                                                   {"flash_attn2", Backend::kCpu},
                                                   {"flash_attn2", Backend::kNative},
                                                   {"blockwise", Backend::kCpu}};
  std::vector<GradCase> cases;
  uint64_t seed = 1;
  for (auto [impl, backend] : impls)
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
      for (const Options& opt : option_sets()) {
        const Shape& sh = shapes[seed % std::size(shapes)];
        cases.push_back({impl, backend, ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.dv, dtype, opt, seed++}});
      }
  // A mask of documents: blocks it hides whole (skipped), keeps whole (unmasked) and in part, alone and causal.
  for (Backend backend : {Backend::kCpu, Backend::kNative})
    for (bool causal : {false, true}) {
      Options opt;
      opt.mask = opt.mask_documents = true;
      opt.causal = causal;
      cases.push_back({"flash_attn2", backend, ProblemSpec{2, 200, 333, 4, 2, 64, 64, DType::kF32, opt, seed++}});
    }
  return cases;
}

Tensor random_d_o(const ProblemSpec& s, DType dtype) {
  std::mt19937_64 rng(s.seed * 31 + 7);
  return random_normal(dtype, {s.batch, s.q_len, s.q_heads, s.v_head_dim}, rng, 1.0f);
}

void expect_gradient(const TensorView& got, const std::vector<double>& want, const char* name,
                     DType rounded_operands = DType::kF32) {
  const GradientComparison c = compare_gradient(got, want, rounded_operands);
  EXPECT_EQ(c.nan, 0) << name;
  EXPECT_EQ(c.wrong, 0) << name << ": max |error| " << c.max_abs_error << " (tolerance " << c.tolerance
                        << ", max |reference| " << c.max_abs_reference << ")";
}

// Gradients that are zero by cancellation (one key: P = 1; a constant V: dP = delta; a constant K: dQ sums dS,
// which sums to zero) come from terms of the inputs' size, which f32 rounds to about 1e-7 where a tolerance scaled
// by the zero result allowed 1e-7 (`verify` failed such f32 files): compare_gradient weighs each element by the
// oracle's sum of |terms|, which bounds it; the CPU kernels pass, and an element off by twice its allowance fails.
TEST(GradientTolerance, CancellingGradientsPassByTheirTermsAndErrorsStillFail) {
  struct Case {
    const char* name;
    int64_t t, s;
    bool constant_v, constant_k;
  };
  auto constant_rows = [](Tensor& t) {  // every key row a copy of the first
    float* p = t.data<float>();
    const int64_t row = t.view().dim(2) * t.view().dim(3);
    for (int64_t j = 1; j < t.view().dim(1); ++j) std::copy(p, p + row, p + j * row);
  };
  for (const Case& c : {Case{"one key", 16, 1, false, false}, Case{"constant V", 40, 40, true, false},
                        Case{"constant K", 40, 40, false, true}}) {
    SCOPED_TRACE(c.name);
    const ProblemSpec spec{1, c.t, c.s, 4, 2, 32, 24, DType::kF32, Options{}, 17};
    Problem problem(spec);
    if (c.constant_v) constant_rows(problem.v);
    if (c.constant_k) constant_rows(problem.k);
    const AttentionInputs in = problem.inputs();
    const Tensor d_o = random_d_o(spec, DType::kF32);
    const ReferenceGradients ref =
        reference_attention_backward_f64(in, problem.params(), TokenPositions::dense(c.t, c.s), d_o);
    for (const char* name : {"sdpa", "flash_attn2"}) {
      const Gradients g = AttentionRegistry::builtin().create(name, Backend::kCpu)->backward(in, problem.params(), d_o);
      for (auto [got, want, terms, what] : {std::tuple{&g.dq, &ref.dq, &ref.dq_terms, "dq"},
                                            std::tuple{&g.dk, &ref.dk, &ref.dk_terms, "dk"},
                                            std::tuple{&g.dv, &ref.dv, &ref.dv_terms, "dv"}}) {
        SCOPED_TRACE(std::string(name) + " " + what);
        ASSERT_EQ(terms->size(), want->size());
        for (size_t i = 0; i < want->size(); ++i) ASSERT_GE((*terms)[i], std::fabs((*want)[i]) * (1 - 1e-12));
        const GradientComparison fine = compare_gradient(got->view(), *want, DType::kF32, terms);
        EXPECT_EQ(fine.wrong, 0) << "max |error| " << fine.max_abs_error << ", tolerance " << fine.tolerance;
        const size_t at = size_t(std::max_element(terms->begin(), terms->end()) - terms->begin());
        Tensor changed(DType::kF32, got->shape(), MemoryKind::kHost);
        std::memcpy(changed.data<float>(), got->data<float>(), size_t(got->view().nbytes()));
        const double allowed = gradient_tolerance(DType::kF32, fine.max_abs_reference) +
                               cancellation_tolerance() * (*terms)[at];
        changed.data<float>()[at] = float((*want)[at] + 2 * allowed);
        EXPECT_EQ(compare_gradient(changed.view(), *want, DType::kF32, terms).wrong, 1);
      }
    }
  }
}

// Logits of about 1e4 (activations 30x a unit normal's): f32 rounds each by about 1e-3, which moves O, LSE and the
// gradients of any f32 kernel; logit_rounding allows for it, and is negligible for unit-scale inputs.
TEST(GradientTolerance, LargeLogitsPassByTheirRoundingWhichUnitInputsDoNotNeed) {
  const ProblemSpec spec{1, 48, 48, 4, 2, 64, 64, DType::kF32, Options{}, 23};
  Problem problem(spec);
  const TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
  const auto largest = [](const std::vector<double>& rows) { return *std::max_element(rows.begin(), rows.end()); };
  const double unit_rounding = largest(logit_rounding(
      problem.inputs(), problem.params(), reference_attention_f64(problem.inputs(), problem.params(), pos).lse));
  EXPECT_LT(unit_rounding, 5e-5);
  for (Tensor* t : {&problem.q, &problem.k})
    for (int64_t i = 0; i < t->view().numel(); ++i) t->data<float>()[i] *= 30.0f;
  const AttentionInputs in = problem.inputs();
  const Tensor d_o = random_d_o(spec, DType::kF32);
  const ReferenceGradients ref = reference_attention_backward_f64(in, problem.params(), pos, d_o);
  const std::vector<double> row_rounding = logit_rounding(in, problem.params(), ref.forward.lse);
  const double rounding = largest(row_rounding);
  EXPECT_GT(rounding, 100 * unit_rounding);
  const double max_v = max_abs_value(in.v);
  for (const char* name : {"sdpa", "flash_attn2"}) {
    SCOPED_TRACE(name);
    auto impl = AttentionRegistry::builtin().create(name, Backend::kCpu);
    const AttentionOutput out = impl->forward(in, problem.params(), pos);
    const Comparison fwd =
        compare(out.o, out.lse, ref.forward, output_tolerance(DType::kF32, max_v), kLseTolerance, &row_rounding, max_v);
    EXPECT_EQ(fwd.wrong, 0) << "o " << fwd.max_abs_error << ", lse " << fwd.max_lse_error;
    const Gradients g = impl->backward(in, problem.params(), d_o);
    for (auto [got, want, terms, what] : {std::tuple{&g.dq, &ref.dq, &ref.dq_terms, "dq"},
                                          std::tuple{&g.dk, &ref.dk, &ref.dk_terms, "dk"},
                                          std::tuple{&g.dv, &ref.dv, &ref.dv_terms, "dv"}}) {
      const GradientComparison c = compare_gradient(got->view(), *want, DType::kF32, terms, rounding);
      EXPECT_EQ(c.wrong, 0) << what << ": max |error| " << c.max_abs_error << ", tolerance " << c.tolerance;
    }
  }
}

// A bias that hides pairs by a large value (-1e9 as HF writes masks, or -inf) gives them no weight: the rows that
// see other keys keep a unit-scale tolerance, where the largest |bias| once made every check vacuous. A row whose keys
// a finite -1e9 hides all alike has logits f32 cannot resolve: its allowance says so.
TEST(GradientTolerance, PairsABiasHidesDoNotLoosenTheRowsThatSeeOthers) {
  ProblemSpec spec{1, 40, 40, 2, 2, 32, 32, DType::kF32, Options{}, 29};
  spec.options.bias = true;
  Problem problem(spec);
  float* bias = problem.bias.data<float>();
  const int64_t T = spec.q_len, S = spec.kv_len, unresolved_row = 7;
  for (int64_t h = 0; h < spec.q_heads; ++h)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < S; ++j) {
        float& x = bias[(h * T + t) * S + j];
        if ((j % 3 == 0 && std::isfinite(x)) || (h == 1 && t == unresolved_row)) x = -1e9f;
      }
  const AttentionInputs in = problem.inputs();
  const TokenPositions pos = TokenPositions::dense(T, S);
  const ReferenceOutput ref = reference_attention_f64(in, problem.params(), pos);
  const std::vector<double> rounding = logit_rounding(in, problem.params(), ref.lse);
  for (int64_t h = 0; h < spec.q_heads; ++h)
    for (int64_t t = 0; t < T; ++t) {
      const double r = rounding[size_t(h * T + t)];
      if (!std::isfinite(ref.lse[size_t(h * T + t)])) {  // head 0's row T / 3: all -inf
        EXPECT_EQ(r, 0.0);
      } else if (h == 1 && t == unresolved_row) {
        EXPECT_GE(r, kUnresolvedLogitRounding);
      } else {
        EXPECT_LT(r, 5e-5) << "head " << h << " row " << t;
      }
    }
  auto impl = AttentionRegistry::builtin().create("flash_attn2", Backend::kCpu);
  const AttentionOutput out = impl->forward(in, problem.params(), pos);
  const double max_v = max_abs_value(in.v), tol = output_tolerance(DType::kF32, max_v);
  EXPECT_EQ(compare(out.o, out.lse, ref, tol, kLseTolerance, &rounding, max_v).wrong, 0);
  // An error of 10 tolerances in a row that sees other keys is found; the unresolved row is allowed V's range.
  Tensor changed = f32_copy(out.o.view());
  changed.data<float>()[(3 * spec.q_heads + 1) * spec.v_head_dim] += float(10 * tol);
  EXPECT_EQ(compare(changed.view(), out.lse, ref, tol, kLseTolerance, &rounding, max_v).wrong, 1);
}

class BackwardVsReference : public testing::TestWithParam<GradCase> {};

TEST_P(BackwardVsReference, MatchesF64Gradients) {
  const GradCase& c = GetParam();
  Problem problem(c.spec);
  if (c.impl == "blockwise") {  // uneven chunks exercise the scan
    problem.params().block_q = 13;
    problem.params().block_k = 17;
  }
  auto impl = AttentionRegistry::builtin().create(c.impl, c.backend);
  ASSERT_TRUE(impl->has_backward()) << c.impl << " has no backward";
  const AttentionInputs in = problem.inputs();
  const Tensor d_o = random_d_o(c.spec, c.spec.dtype);
  const Gradients g = impl->backward(in, problem.params(), d_o);
  const ReferenceGradients ref =
      reference_attention_backward_f64(in, problem.params(), TokenPositions::dense(c.spec.q_len, c.spec.kv_len), d_o);
  EXPECT_EQ(g.dq.dtype(), c.spec.dtype);
  expect_gradient(g.dq, ref.dq, "dq");
  expect_gradient(g.dk, ref.dk, "dk");
  expect_gradient(g.dv, ref.dv, "dv");
  if (in.bias.defined()) expect_gradient(g.dbias, ref.dbias, "dbias");
  if (in.sinks.defined()) expect_gradient(g.dsinks, ref.dsinks, "dsinks");
  if (c.spec.options.mask) {  // Problem masks row T/2 of every batch entirely: its dq is exactly 0
    const int64_t T = c.spec.q_len, H = c.spec.q_heads, D = c.spec.head_dim;
    for (int64_t b = 0; b < c.spec.batch; ++b)
      for (int64_t i = 0; i < H * D; ++i)
        ASSERT_EQ(load_as_f32(g.dq.data<void>(), g.dq.dtype(), size_t((b * T + T / 2) * H * D + i)), 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackwardVsReference, testing::ValuesIn(cpu_grad_cases()), grad_case_name);

// A loss that reads LSE too: dLSE beside dO, from the implementation's own forward (O in f32, as the
// backward's own forward keeps it). Fully masked rows (LSE -inf) take a dLSE and still give zero dQ.
class LseInTheLoss : public testing::TestWithParam<GradCase> {};

TEST_P(LseInTheLoss, MatchesF64Gradients) {
  const GradCase& c = GetParam();
  Problem problem(c.spec);
  auto impl = AttentionRegistry::builtin().create(c.impl, c.backend);
  const AttentionInputs in = problem.inputs();
  const int64_t B = c.spec.batch, T = c.spec.q_len, Hq = c.spec.q_heads;
  const TokenPositions pos = TokenPositions::dense(T, c.spec.kv_len);
  const Tensor d_o = random_d_o(c.spec, c.spec.dtype);
  std::mt19937_64 rng(c.spec.seed * 17 + 3);
  const Tensor d_lse = random_normal(DType::kF32, {B, Hq, T}, rng, 1.0f);
  const Tensor o(DType::kF32, {B, T, Hq, c.spec.v_head_dim}), lse(DType::kF32, {B, Hq, T});
  impl->forward_into(in, problem.params(), pos, ForwardViews{o.view(), lse.view()});
  const Gradients g = impl->backward(in, problem.params(), pos, d_o, ForwardViews{o.view(), lse.view()}, false,
                                     nullptr, d_lse);
  const ReferenceGradients ref = reference_attention_backward_f64(in, problem.params(), pos, d_o, true, d_lse);
  expect_gradient(g.dq, ref.dq, "dq");
  expect_gradient(g.dk, ref.dk, "dk");
  expect_gradient(g.dv, ref.dv, "dv");
  if (in.bias.defined()) expect_gradient(g.dbias, ref.dbias, "dbias");
  if (in.sinks.defined()) expect_gradient(g.dsinks, ref.dsinks, "dsinks");
  if (c.spec.options.mask) {  // Problem masks row T/2 of every batch entirely
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Hq * c.spec.head_dim; ++i)
        ASSERT_EQ(load_as_f32(g.dq.data<void>(), g.dq.dtype(), size_t((b * T + T / 2) * Hq * c.spec.head_dim + i)), 0.0f);
  }
  // dLSE moves the gradients: the same call without it differs (unless the mask hides the only row).
  if (c.spec.options.mask && T == 1) return;
  const Gradients without = impl->backward(in, problem.params(), pos, d_o, ForwardViews{o.view(), lse.view()});
  EXPECT_NE(std::memcmp(g.dk.data<void>(), without.dk.data<void>(), g.dk.view().nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Cpu, LseInTheLoss, testing::ValuesIn(cpu_grad_cases()), grad_case_name);

// K/V cut into blocks of any sizes, accumulate_backward once per block (dq shared, dk / dv per block):
// the same gradients as one call, up to f32 rounding.
class BackwardBlocks : public testing::TestWithParam<std::string> {};

TEST_P(BackwardBlocks, SplittingKeysIntoBlocksEqualsOneBlock) {
  const Options all{true, true, true, true, true, true, true, true};
  ProblemSpec spec{2, 23, 61, 4, 2, 32, 24, DType::kF32, all, 5};
  Problem problem(spec);
  auto impl = AttentionRegistry::builtin().create(GetParam(), Backend::kCpu);
  const AttentionInputs in = problem.inputs();
  const TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
  const Tensor d_o = random_d_o(spec, DType::kF32);
  const AttentionOutput out = impl->forward(in, problem.params());
  const Gradients whole = impl->backward(in, problem.params(), d_o, &out, true);
  const Tensor delta = compute_delta(out.o, d_o, TensorView());
  const BackwardInputs grad{out.lse, d_o, delta};
  GradAccumulators total = GradAccumulators::zeros(in, MemoryKind::kHost);
  const int64_t cuts[] = {0, 1, 14, 15, 40, 61};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    const int64_t lo = cuts[i], len = cuts[i + 1] - cuts[i];
    AttentionInputs block = in;
    block.k = narrow(in.k, 1, lo, len);
    block.v = narrow(in.v, 1, lo, len);
    block.kv_segment_ids = narrow(in.kv_segment_ids, 1, lo, len);
    TokenPositions block_pos = pos;
    block_pos.k.assign(pos.k.begin() + lo, pos.k.begin() + lo + len);
    GradAccumulators part = GradAccumulators::zeros(block, MemoryKind::kHost);
    impl->accumulate_backward(block, block_pos, problem.params(), grad,
                              GradViews{total.dq, part.dk, part.dv, total.dbias});
    for (int64_t b = 0; b < spec.batch; ++b)
      for (auto [from, into, width] : {std::tuple{&part.dk, &total.dk, spec.kv_heads * spec.head_dim},
                                       std::tuple{&part.dv, &total.dv, spec.kv_heads * spec.v_head_dim}})
        std::copy_n(from->data<float>() + b * len * width, len * width,
                    into->data<float>() + (b * spec.kv_len + lo) * width);
  }
  for (auto [got, want, name] : {std::tuple{&total.dq, &whole.dq, "dq"}, std::tuple{&total.dk, &whole.dk, "dk"},
                                 std::tuple{&total.dv, &whole.dv, "dv"}, std::tuple{&total.dbias, &whole.dbias, "dbias"}}) {
    double worst = 0, scale = 1e-3;
    for (int64_t i = 0; i < want->numel(); ++i) scale = std::max(scale, double(std::fabs(want->data<float>()[i])));
    for (int64_t i = 0; i < want->numel(); ++i)
      worst = std::max(worst, double(std::fabs(got->data<float>()[i] - want->data<float>()[i])));
    EXPECT_LT(worst, 1e-5 * scale) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackwardBlocks, testing::Values("sdpa", "flash_attn2", "blockwise"));

// Dropout keys its decisions by global batch and head (AttentionParams::batch_offset / head_offset): a call on
// a slice of the batch and heads, as a mesh's dp / tp rank makes, gives that slice of the whole call's O, LSE
// and gradients; the same slice without its offsets drops other pairs (the mesh's runs were wrong so).
class DropoutSlice : public testing::TestWithParam<std::string> {};

TEST_P(DropoutSlice, ASliceOfBatchAndHeadsDropsWhatTheWholeDoes) {
  Options options;
  options.causal = options.dropout = options.sinks = options.bias = true;
  const ProblemSpec spec{3, 29, 37, 6, 3, 16, 24, DType::kF32, options, 11};
  Problem problem(spec);
  auto impl = AttentionRegistry::builtin().create(GetParam(), Backend::kCpu);
  const AttentionInputs whole_in = problem.inputs();
  const Tensor d_o = random_d_o(spec, DType::kF32);
  const AttentionOutput whole = impl->forward(whole_in, problem.params());
  const Gradients whole_grads = impl->backward(whole_in, problem.params(), d_o, &whole, true);
  const int64_t b0 = 1, batches = 2, kv_head0 = 1, kv_heads = 2, group = spec.q_heads / spec.kv_heads;
  const int64_t h0 = kv_head0 * group, heads = kv_heads * group;
  // A contiguous copy of rows [start, start + length) of `dims` (batch dim first, heads dim second; -1: none).
  auto slice = [&](const TensorView& t, int batch_dim, int head_dim, int64_t head_start, int64_t head_count) {
    TensorView part = t;
    if (batch_dim >= 0 && t.dim(batch_dim) > 1) part = narrow(part, batch_dim, b0, batches);
    if (head_dim >= 0 && t.dim(head_dim) > 1) part = narrow(part, head_dim, head_start, head_count);
    return f32_copy(part);
  };
  const Tensor q = slice(whole_in.q, 0, 2, h0, heads), k = slice(whole_in.k, 0, 2, kv_head0, kv_heads);
  const Tensor v = slice(whole_in.v, 0, 2, kv_head0, kv_heads), bias = slice(whole_in.bias, 0, 1, h0, heads);
  const Tensor sinks = slice(whole_in.sinks, -1, 0, h0, heads), part_do = slice(d_o, 0, 2, h0, heads);
  AttentionInputs in = whole_in;
  in.q = q, in.k = k, in.v = v, in.bias = bias, in.sinks = sinks;
  // (dsinks and dbias sum over every batch entry, so a batch slice has its own: not compared.)
  const char* names[] = {"o", "lse", "dq", "dk", "dv"};
  const Tensor expected[] = {slice(whole.o, 0, 2, h0, heads),           slice(whole.lse, 0, 1, h0, heads),
                             slice(whole_grads.dq, 0, 2, h0, heads),    slice(whole_grads.dk, 0, 2, kv_head0, kv_heads),
                             slice(whole_grads.dv, 0, 2, kv_head0, kv_heads)};
  for (bool offsets : {true, false}) {
    SCOPED_TRACE(offsets ? "with the slice's offsets" : "without them");
    AttentionParams params = problem.params();
    if (offsets) params.batch_offset = b0, params.head_offset = h0;
    const AttentionOutput out = impl->forward(in, params);
    const Gradients grads = impl->backward(in, params, part_do, &out, true);
    const TensorView got[] = {out.o, out.lse, grads.dq, grads.dk, grads.dv};
    double worst = 0;
    for (size_t i = 0; i < std::size(expected); ++i) {
      ASSERT_EQ(got[i].numel(), expected[i].numel()) << names[i];
      const std::vector<float> values = as_f32(got[i]);
      double error = 0;
      for (int64_t j = 0; j < expected[i].numel(); ++j)
        error = std::max(error, double(std::fabs(values[size_t(j)] - expected[i].data<float>()[j])));
      if (offsets) {
        EXPECT_LT(error, 1e-5) << names[i];
      }
      worst = std::max(worst, error);
    }
    if (!offsets) {
      EXPECT_GT(worst, 1e-2) << "the slice without its offsets should drop other pairs";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, DropoutSlice, testing::Values("sdpa", "flash_attn2", "blockwise"));

// sdpa and blockwise take any head dim (flash_attn2 stops at 256 and says so): D = 300, Dv = 264 against f64.
TEST(AnyHeadDim, SdpaAndBlockwiseRunHeadDimsPast256) {
  Options options;
  options.causal = options.sinks = true;
  const ProblemSpec spec{1, 19, 23, 4, 2, 300, 264, DType::kF32, options, 21};
  Problem problem(spec);
  const AttentionInputs in = problem.inputs();
  const Tensor d_o = random_d_o(spec, DType::kF32);
  const TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
  const ReferenceOutput ref_out = reference_attention_f64(in, problem.params(), pos);
  const ReferenceGradients ref = reference_attention_backward_f64(in, problem.params(), pos, d_o);
  for (const char* name : {"sdpa", "blockwise"}) {
    SCOPED_TRACE(name);
    auto impl = AttentionRegistry::builtin().create(name, Backend::kCpu);
    const AttentionOutput out = impl->forward(in, problem.params(), pos);
    const Comparison cmp =
        compare(out.o, out.lse, ref_out, output_tolerance(DType::kF32, max_abs_value(in.v)), kLseTolerance);
    EXPECT_EQ(cmp.wrong, 0) << "o " << cmp.max_abs_error << ", lse " << cmp.max_lse_error;
    const Gradients g = impl->backward(in, problem.params(), d_o);
    expect_gradient(g.dq, ref.dq, "dq");
    expect_gradient(g.dk, ref.dk, "dk");
    expect_gradient(g.dv, ref.dv, "dv");
  }
}

// Closed forms: dO = 0 gives zero gradients exactly; constant V rows make every dP equal delta, so
// dQ = dK = 0 and dV = P^T dO.
TEST(BackwardClosedForm, ZeroUpstreamGradientGivesZeroGradients) {
  for (const char* name : {"sdpa", "flash_attn2", "blockwise"}) {
    ProblemSpec spec{1, 19, 27, 4, 2, 32, 32, DType::kF32, Options{true, false, true, true, true}, 3};
    Problem problem(spec);
    const Tensor d_o(DType::kF32, {1, 19, 4, 32});
    const Gradients g = AttentionRegistry::builtin().create(name, Backend::kCpu)->backward(problem.inputs(), problem.params(), d_o);
    for (const Tensor* t : {&g.dq, &g.dk, &g.dv, &g.dbias, &g.dsinks})
      for (int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->data<float>()[i], 0.0f) << name;
  }
}

TEST(BackwardClosedForm, ConstantValuesGiveZeroDqDkAndDvIsPTransposeDo) {
  for (const char* name : {"sdpa", "flash_attn2", "blockwise"}) {
    const int64_t T = 21, S = 30, H = 2, D = 16, Dv = 8;
    ProblemSpec spec{1, T, S, H, H, D, Dv, DType::kF32, Options{true}, 9};
    Problem problem(spec);
    for (int64_t j = 0; j < S * H; ++j)
      for (int64_t d = 0; d < Dv; ++d) problem.v.data<float>()[j * Dv + d] = 0.25f * float(d + 1);
    const Tensor d_o = random_d_o(spec, DType::kF32);
    auto impl = AttentionRegistry::builtin().create(name, Backend::kCpu);
    const AttentionOutput out = impl->forward(problem.inputs(), problem.params());
    const Gradients g = impl->backward(problem.inputs(), problem.params(), d_o, &out);
    double worst_qk = 0, worst_v = 0;
    for (const Tensor* t : {&g.dq, &g.dk})
      for (int64_t i = 0; i < t->numel(); ++i) worst_qk = std::max(worst_qk, double(std::fabs(t->data<float>()[i])));
    const float scale = 1.0f / std::sqrt(float(D));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < S; ++j)
        for (int64_t d = 0; d < Dv; ++d) {
          double want = 0;
          for (int64_t t = 0; t < T; ++t) {
            if (j > t + S - T) continue;  // causal
            double x = 0;
            for (int64_t e = 0; e < D; ++e)
              x += double(problem.q.data<float>()[(t * H + h) * D + e]) * problem.k.data<float>()[(j * H + h) * D + e];
            const double p = std::exp(x * scale - double(out.lse.data<float>()[h * T + t]));
            want += p * d_o.data<float>()[(t * H + h) * Dv + d];
          }
          worst_v = std::max(worst_v, std::fabs(want - g.dv.data<float>()[(j * H + h) * Dv + d]));
        }
    EXPECT_LT(worst_qk, 1e-5) << name;
    EXPECT_LT(worst_v, 1e-5) << name;
  }
}

// Bad input is refused naming the tensor and dimension, before any work.
TEST(BackwardValidation, RefusesWrongDoAndMissingLse) {
  ProblemSpec spec{1, 9, 11, 4, 2, 32, 24, DType::kBF16, Options{}, 4};
  Problem problem(spec);
  auto impl = AttentionRegistry::builtin().create("sdpa", Backend::kCpu);
  auto message = [&](const std::function<void()>& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Tensor wrong_dim(DType::kBF16, {1, 9, 4, 32});
  EXPECT_NE(message([&] { impl->backward(problem.inputs(), problem.params(), wrong_dim); })
                .find("do dimension 3 (v_head_dim) is 32, expected 24"),
            std::string::npos);
  const Tensor wrong_len(DType::kBF16, {1, 8, 4, 24});
  EXPECT_NE(message([&] { impl->backward(problem.inputs(), problem.params(), wrong_len); })
                .find("do dimension 1 (q_len) is 8, expected 9"),
            std::string::npos);
  const Tensor wrong_dtype(DType::kF16, {1, 9, 4, 24});
  EXPECT_NE(message([&] { impl->backward(problem.inputs(), problem.params(), wrong_dtype); })
                .find("do has dtype f16, expected q's bf16 or f32"),
            std::string::npos);
  EXPECT_NE(message([&] { impl->backward(problem.inputs(), problem.params(), TensorView()); }).find("do (the gradient of o) is required"),
            std::string::npos);
  const Tensor d_o(DType::kBF16, {1, 9, 4, 24});
  AttentionOutput no_lse{Tensor(DType::kBF16, {1, 9, 4, 24}), Tensor()};
  EXPECT_NE(message([&] { impl->backward(problem.inputs(), problem.params(), d_o, &no_lse); })
                .find("lse (the forward's log-sum-exp) is required"),
            std::string::npos);
  AttentionOutput short_lse{Tensor(DType::kBF16, {1, 9, 4, 24}), Tensor(DType::kF32, {1, 4, 8})};
  EXPECT_NE(message([&] { impl->backward(problem.inputs(), problem.params(), d_o, &short_lse); })
                .find("lse dimension 2 (q_len) is 8, expected 9"),
            std::string::npos);
  const Tensor o(DType::kBF16, {1, 9, 4, 24}), lse(DType::kF32, {1, 4, 9});
  const TokenPositions pos = TokenPositions::dense(9, 11);
  auto with_d_lse = [&](const Tensor& d_lse) {
    return message([&] {
      impl->backward(problem.inputs(), problem.params(), pos, d_o, ForwardViews{o.view(), lse.view()}, false, nullptr,
                     d_lse);
    });
  };
  EXPECT_NE(with_d_lse(Tensor(DType::kF32, {1, 2, 9})).find("dlse dimension 1 (q_heads) is 2, expected 4"),
            std::string::npos);
  EXPECT_NE(with_d_lse(Tensor(DType::kBF16, {1, 4, 9})).find("dlse has shape (1, 4, 9) and dtype bf16, expected "
                                                             "contiguous f32"),
            std::string::npos);
}

// Each SIMD variant of the CPU flash backward on its own (the registry picks only the best one), with
// each way of forming dQ (a second pass over query blocks, or per-thread partials in the key-block pass).
class FlashBackwardIsa : public testing::TestWithParam<std::tuple<CpuIsa, CpuDqStrategy>> {};

TEST_P(FlashBackwardIsa, MatchesF64Gradients) {
  const auto [isa, dq_strategy] = GetParam();
  if (isa == CpuIsa::kAvx512 && best_cpu_isa() != CpuIsa::kAvx512) GTEST_SKIP() << "no AVX-512 here";
  if (isa == CpuIsa::kAvx2 && best_cpu_isa() == CpuIsa::kGeneric) GTEST_SKIP() << "no AVX2 here";
  const ProblemSpec spec{2, 97, 130, 8, 2, 80, 72, DType::kF32, Options{true, true, true, true, true, true, true, true}, 11};
  Problem problem(spec);
  const AttentionInputs in = problem.inputs();
  const TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
  const Tensor d_o = random_d_o(spec, DType::kF32);
  const ReferenceGradients ref = reference_attention_backward_f64(in, problem.params(), pos, d_o);
  Tensor lse(DType::kF32, {2, 8, 97}), o(DType::kF32, {2, 97, 8, 72});
  for (size_t i = 0; i < ref.forward.lse.size(); ++i) lse.data<float>()[i] = float(ref.forward.lse[i]);
  for (size_t i = 0; i < ref.forward.o.size(); ++i) o.data<float>()[i] = float(ref.forward.o[i]);
  const Tensor delta = compute_delta(o, d_o, TensorView());
  GradAccumulators acc = GradAccumulators::zeros(in, MemoryKind::kHost);
  flash_accumulate_backward_cpu(in, pos, problem.params(), BackwardInputs{lse, d_o, delta}, acc.views(), isa,
                                dq_strategy);
  expect_gradient(acc.dq, ref.dq, "dq");
  expect_gradient(acc.dk, ref.dk, "dk");
  expect_gradient(acc.dv, ref.dv, "dv");
  expect_gradient(acc.dbias, ref.dbias, "dbias");
}

// dQ from per-thread partials is the same bits on every run: each thread sums the same tiles in the same
// order (tasks dealt round robin, not to whichever thread is free) and the partials add in thread order.
TEST(FlashBackwardDq, ThreadPartialsGiveTheSameBitsOnEveryRun) {
  const ProblemSpec spec{2, 300, 300, 4, 2, 64, 64, DType::kF32, Options{true}, 5};
  Problem problem(spec);
  const AttentionInputs in = problem.inputs();
  const TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
  const Tensor d_o = random_d_o(spec, DType::kF32);
  auto impl = AttentionRegistry::builtin().create("flash_attn2", Backend::kCpu);
  const AttentionOutput out = impl->forward(in, problem.params());
  const Tensor delta = compute_delta(out.o, d_o, TensorView());
  const BackwardInputs grad{out.lse, d_o, delta};
  std::vector<Tensor> dq;
  for (int run = 0; run < 4; ++run) {
    GradAccumulators acc = GradAccumulators::zeros(in, MemoryKind::kHost);
    flash_accumulate_backward_cpu(in, pos, problem.params(), grad, acc.views(), best_cpu_isa(),
                                  CpuDqStrategy::kThreadPartials);
    dq.push_back(std::move(acc.dq));
  }
  for (int run = 1; run < 4; ++run)
    EXPECT_EQ(std::memcmp(dq[0].data<float>(), dq[size_t(run)].data<float>(), dq[0].view().nbytes()), 0) << "run " << run;
}

// A broadcast bias's gradient is shared across batch entries, heads, rows or keys. Each host backward gives
// every shared element to one thread, which takes its sharers in order: on 4, 2 or 1 threads the same bits on
// every run (with or without deterministic; dQ's thread partials on one thread count), and the f64 reference's
// gradients.
TEST(HostBackward, BroadcastBiasGradientIsTheSameBitsOnEveryRun) {
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(4);
  const ProblemSpec spec{2, 29, 70, 4, 2, 16, 24, DType::kF32, Options{true}, 23};
  Problem problem(spec);
  const TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
  const Tensor d_o = random_d_o(spec, DType::kF32);
  std::mt19937_64 rng(24);
  const Shape shapes[] = {{1, 1, 29, 70}, {1, 4, 29, 70}, {2, 1, 29, 70}, {2, 4, 1, 70}, {2, 4, 29, 1}, {1, 1, 1, 70}};
  for (const Shape& shape : shapes) {
    problem.bias = random_normal(DType::kF32, shape, rng, 1.0f);
    const AttentionInputs in = problem.inputs();
    AttentionParams params = problem.params();
    const ReferenceGradients ref = reference_attention_backward_f64(in, params, pos, d_o);
    Tensor lse(DType::kF32, {2, 4, 29}), o(DType::kF32, {2, 29, 4, 24});
    for (size_t i = 0; i < ref.forward.lse.size(); ++i) lse.data<float>()[i] = float(ref.forward.lse[i]);
    for (size_t i = 0; i < ref.forward.o.size(); ++i) o.data<float>()[i] = float(ref.forward.o[i]);
    const Tensor delta = compute_delta(o, d_o, TensorView());
    const BackwardInputs grad{lse, d_o, delta};
    const std::function<void(const GradViews&)> backwards[] = {
        [&](const GradViews& acc) {
          AttentionRegistry::builtin().create("sdpa", Backend::kCpu)->accumulate_backward(in, pos, params, grad, acc);
        },
        [&](const GradViews& acc) {
          AttentionRegistry::builtin().create("blockwise", Backend::kCpu)->accumulate_backward(in, pos, params, grad,
                                                                                              acc);
        },
        [&](const GradViews& acc) {
          flash_accumulate_backward_cpu(in, pos, params, grad, acc, best_cpu_isa(), CpuDqStrategy::kSecondPass);
        },
        [&](const GradViews& acc) {
          flash_accumulate_backward_cpu(in, pos, params, grad, acc, best_cpu_isa(), CpuDqStrategy::kThreadPartials);
        },
    };
    for (size_t which = 0; which < std::size(backwards); ++which) {
      const std::string what = "backward " + std::to_string(which) + ", bias " + shape.str();
      GradAccumulators first = GradAccumulators::zeros(in, MemoryKind::kHost);
      backwards[which](first.views());
      // A bias broadcast over keys has dbias = sum of a row's dS = 0: allowed by its terms, as verify does.
      const GradientComparison dbias = compare_gradient(first.dbias, ref.dbias, DType::kF32, &ref.dbias_terms);
      EXPECT_EQ(dbias.wrong + dbias.nan, 0) << what << ": dbias max |error| " << dbias.max_abs_error;
      expect_gradient(first.dq, ref.dq, what.c_str());
      for (int run = 0; run < 4; ++run) {
        params.deterministic = run % 2 == 0;
        omp_set_num_threads(run < 2 ? 4 : run - 1);  // and on 1 and 2 threads
        GradAccumulators again = GradAccumulators::zeros(in, MemoryKind::kHost);
        backwards[which](again.views());
        omp_set_num_threads(4);
        for (const auto& [mine, theirs] : {std::pair{&again.dbias, &first.dbias}, std::pair{&again.dq, &first.dq},
                                           std::pair{&again.dk, &first.dk}, std::pair{&again.dv, &first.dv}}) {
          if (mine == &again.dq && which == 3 && run >= 2) continue;  // thread partials: dQ's order is the threads'
          EXPECT_EQ(std::memcmp(mine->data<float>(), theirs->data<float>(), theirs->view().nbytes()), 0)
              << what << ", run " << run;
        }
      }
      params.deterministic = false;
    }
  }
  omp_set_num_threads(threads_before);
}

INSTANTIATE_TEST_SUITE_P(Cpu, FlashBackwardIsa,
                         testing::Combine(testing::Values(CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512),
                                          testing::Values(CpuDqStrategy::kSecondPass, CpuDqStrategy::kThreadPartials)),
                         [](const auto& info) {
                           return std::string(cpu_isa_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == CpuDqStrategy::kSecondPass ? "_dq_second_pass"
                                                                                         : "_dq_thread_partials");
                         });

}  // namespace
}  // namespace ra::test
