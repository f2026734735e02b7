// The bias's and the sinks' gradients as backward()'s caller asks for them (GradViews as `into`): not
// formed at all (a bias that is an attention mask takes none), or written into the caller's views (a
// graph being captured owns those, not ringattn). Either way dq, dk and dv stay those of the plain call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "attention/registry.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "tests/support/problem.h"

namespace ra::test {
namespace {

Tensor random_d_o(const ProblemSpec& s) {
  std::mt19937_64 rng(s.seed * 13 + 5);
  return random_normal(DType::kF32, {s.batch, s.q_len, s.q_heads, s.v_head_dim}, rng, 1.0f);
}

double worst_difference(const TensorView& got, const TensorView& want) {
  EXPECT_EQ(got.shape(), want.shape());
  double worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    worst = std::max(worst, double(std::fabs(got.data_as<float>()[i] - want.data_as<float>()[i])));
  return worst;
}

struct Call {
  Problem problem;
  std::unique_ptr<AttentionImpl> impl;
  AttentionOutput forward;
  Tensor d_o;
  explicit Call(const std::string& name)
      : problem(ProblemSpec{2, 29, 43, 4, 2, 16, 12, DType::kF32,
                            Options{true, true, true, true, true, true, true, false}, 11}),
        impl(AttentionRegistry::builtin().create(name, Backend::kCpu)),
        forward(impl->forward(problem.inputs(), problem.params())),
        d_o(random_d_o(problem.spec())) {}
  // backward() into f32 dq, dk, dv made here; `views` chooses the bias's and the sinks' gradients.
  Gradients run(GradViews& views) {
    const AttentionInputs in = problem.inputs();
    dq = Tensor(DType::kF32, in.q.shape());
    dk = Tensor(DType::kF32, in.k.shape());
    dv = Tensor(DType::kF32, in.v.shape());
    views.dq = dq, views.dk = dk, views.dv = dv;
    return impl->backward(in, problem.params(), TokenPositions::dense(in.q.dim(1), in.k.dim(1)), d_o,
                          ForwardViews{forward.o.view(), forward.lse.view()}, false, &views);
  }
  Tensor dq, dk, dv;
};

class ParameterGradients : public testing::TestWithParam<std::string> {};

TEST_P(ParameterGradients, NotAskedForAreNotFormedAndTheRestIsUnchanged) {
  Call call(GetParam());
  GradViews all;
  const Gradients with = call.run(all);
  ASSERT_TRUE(with.dbias.defined() && with.dsinks.defined());
  const Tensor dq = std::move(call.dq), dk = std::move(call.dk), dv = std::move(call.dv);
  for (auto [bias, sinks] : {std::pair{false, true}, std::pair{true, false}, std::pair{false, false}}) {
    GradViews some;
    some.bias_gradient = bias, some.sinks_gradient = sinks;
    const Gradients g = call.run(some);
    EXPECT_EQ(g.dbias.defined(), bias);
    EXPECT_EQ(g.dsinks.defined(), sinks);
    // The same sums in the same order: the same bits.
    EXPECT_EQ(worst_difference(call.dq, dq), 0) << "dq";
    EXPECT_EQ(worst_difference(call.dk, dk), 0) << "dk";
    EXPECT_EQ(worst_difference(call.dv, dv), 0) << "dv";
    if (bias) {
      EXPECT_EQ(worst_difference(g.dbias, with.dbias), 0) << "dbias";
    }
    if (sinks) {
      EXPECT_EQ(worst_difference(g.dsinks, with.dsinks), 0) << "dsinks";
    }
  }
}

TEST_P(ParameterGradients, GivenViewsAreWrittenInsteadOfReturned) {
  Call call(GetParam());
  GradViews all;
  const Gradients with = call.run(all);
  const AttentionInputs in = call.problem.inputs();
  // Garbage first: the views are written over, not added to.
  Tensor dbias(DType::kF32, in.bias.shape()), dsinks(DType::kF32, {in.q.dim(2)});
  std::fill_n(dbias.data<float>(), dbias.numel(), 7.0f);
  std::fill_n(dsinks.data<float>(), dsinks.numel(), -3.0f);
  GradViews into;
  into.dbias = dbias, into.dsinks = dsinks;
  const Gradients g = call.run(into);
  EXPECT_FALSE(g.dbias.defined());
  EXPECT_FALSE(g.dsinks.defined());
  EXPECT_EQ(worst_difference(dbias, with.dbias), 0);
  EXPECT_EQ(worst_difference(dsinks, with.dsinks), 0);
}

TEST_P(ParameterGradients, ViewsThatDoNotFitAreRefusedByName) {
  Call call(GetParam());
  const AttentionInputs in = call.problem.inputs();
  auto refusal = [&](GradViews views) {
    try {
      call.run(views);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  Tensor wide(DType::kF32, {in.bias.dim(0), in.bias.dim(1), in.bias.dim(2), in.bias.dim(3) + 1});
  Tensor half(DType::kBF16, in.bias.shape()), dsinks(DType::kF32, {in.q.dim(2)});
  GradViews bad;
  bad.dbias = wide;
  EXPECT_NE(refusal(bad).find("output dbias has shape"), std::string::npos) << refusal(bad);
  bad.dbias = half;
  EXPECT_NE(refusal(bad).find("output dbias has dtype bf16"), std::string::npos) << refusal(bad);
  GradViews contradicting;
  contradicting.dsinks = dsinks, contradicting.sinks_gradient = false;
  EXPECT_NE(refusal(contradicting).find("output dsinks is given, but the gradient of sinks is not asked for"),
            std::string::npos) << refusal(contradicting);
}

INSTANTIATE_TEST_SUITE_P(Cpu, ParameterGradients, testing::Values("sdpa", "flash_attn2", "blockwise"));

TEST(ParameterGradients, AGradientViewForAParameterTheCallLacksIsRefused) {
  ProblemSpec spec{1, 9, 9, 2, 2, 8, 8, DType::kF32, Options{}, 3};
  Problem problem(spec);
  auto impl = AttentionRegistry::builtin().create("sdpa", Backend::kCpu);
  const AttentionInputs in = problem.inputs();
  const AttentionOutput forward = impl->forward(in, problem.params());
  const Tensor d_o = random_d_o(spec);
  Tensor dq(DType::kF32, in.q.shape()), dk(DType::kF32, in.k.shape()), dv(DType::kF32, in.v.shape());
  Tensor dbias(DType::kF32, {1, 2, 9, 9});
  GradViews into{dq, dk, dv, dbias};
  try {
    impl->backward(in, problem.params(), TokenPositions::dense(9, 9), d_o,
                   ForwardViews{forward.o.view(), forward.lse.view()}, false, &into);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("output dbias is given, but the call has no bias"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace ra::test
