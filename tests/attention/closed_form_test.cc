// Closed-form cases that need no reference: Q = 0 averages the visible V rows, constant V gives the
// constant, the first causal row gives V0, a fully masked row gives O = 0 and LSE = -inf.
#include <gtest/gtest.h>

#include <cmath>

#include "attention/registry.h"
#include "tests/support/problem.h"

namespace ra::test {
namespace {

class ClosedForm : public testing::TestWithParam<std::pair<std::string, Backend>> {
 protected:
  std::unique_ptr<AttentionImpl> impl() const {
    return AttentionRegistry::builtin().create(GetParam().first, GetParam().second);
  }
};

TEST_P(ClosedForm, ZeroQueryAveragesVisibleRows) {
  ProblemSpec spec{1, 70, 70, 2, 1, 64, 16};
  Problem p(spec);
  std::fill(p.q.data<float>(), p.q.data<float>() + p.q.numel(), 0.0f);
  p.params().causal = true;
  AttentionOutput out = impl()->forward(p.inputs(), p.params());
  const float* v = p.v.data<float>();
  for (int64_t t : {0, 1, 33, 69}) {
    for (int64_t d = 0; d < 16; ++d) {
      double mean = 0;
      for (int64_t j = 0; j <= t; ++j) mean += v[j * 16 + d];
      mean /= double(t + 1);
      EXPECT_NEAR(out.o.data<float>()[(t * 2 + 1) * 16 + d], mean, 1e-5) << "row " << t;
    }
    EXPECT_NEAR(out.lse.data<float>()[1 * 70 + t], std::log(double(t + 1)), 1e-5);
  }
}

TEST_P(ClosedForm, ConstantValueGivesTheConstant) {
  ProblemSpec spec{1, 33, 90, 4, 2, 32, 8};
  spec.options.window = true;
  Problem p(spec);
  std::fill(p.v.data<float>(), p.v.data<float>() + p.v.numel(), 2.75f);
  AttentionOutput out = impl()->forward(p.inputs(), p.params());
  for (int64_t i = 0; i < out.o.numel(); ++i) ASSERT_NEAR(out.o.data<float>()[i], 2.75f, 1e-5) << i;
}

TEST_P(ClosedForm, FirstCausalRowIsFirstValue) {
  Problem p(ProblemSpec{2, 50, 50, 2, 2, 32, 32});
  p.params().causal = true;
  AttentionOutput out = impl()->forward(p.inputs(), p.params());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 32; ++d)
        EXPECT_FLOAT_EQ(out.o.data<float>()[((b * 50) * 2 + h) * 32 + d], p.v.data<float>()[((b * 50) * 2 + h) * 32 + d]);
}

TEST_P(ClosedForm, FullyMaskedRowIsZeroWithMinusInfLse) {
  Problem p(ProblemSpec{1, 20, 100, 2, 2, 32, 32});
  Tensor mask(DType::kU8, {1, 1, 20, 100});
  std::fill(mask.data<uint8_t>(), mask.data<uint8_t>() + mask.numel(), uint8_t(1));
  std::fill(mask.data<uint8_t>() + 7 * 100, mask.data<uint8_t>() + 8 * 100, uint8_t(0));
  AttentionInputs in = p.inputs();
  in.mask = mask;
  AttentionOutput out = impl()->forward(in, p.params());
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t d = 0; d < 32; ++d) EXPECT_EQ(out.o.data<float>()[(7 * 2 + h) * 32 + d], 0.0f);
    EXPECT_EQ(out.lse.data<float>()[h * 20 + 7], -INFINITY);
    EXPECT_TRUE(std::isfinite(out.lse.data<float>()[h * 20 + 6]));
  }
  for (int64_t i = 0; i < out.o.numel(); ++i) ASSERT_FALSE(std::isnan(out.o.data<float>()[i]));
}

TEST_P(ClosedForm, CausalIsANoOpForOneQuery) {
  Problem p(ProblemSpec{1, 1, 45, 2, 2, 32, 32});
  AttentionOutput plain = impl()->forward(p.inputs(), p.params());
  p.params().causal = true;
  AttentionOutput causal = impl()->forward(p.inputs(), p.params());
  for (int64_t i = 0; i < plain.o.numel(); ++i) EXPECT_EQ(plain.o.data<float>()[i], causal.o.data<float>()[i]);
}

// Logits around 1e4 (q and k scaled by 100) and f16 values near its largest finite number: no NaN or
// Inf, O within the dtype's tolerance of the f64 reference, LSE within f32 rounding of its magnitude.
TEST_P(ClosedForm, ExtremeLogitsAndLargeF16ValuesStayFinite) {
  for (DType dtype : {DType::kF32, DType::kF16}) {
    Problem p(ProblemSpec{1, 37, 53, 2, 1, 64, 64, dtype, Options{true}, 9});
    for (Tensor* t : {&p.q, &p.k}) {  // x 100 in the problem's own dtype
      std::vector<float> values(size_t(t->numel()));
      convert_to_f32(t->view().data(), dtype, values.data(), values.size());
      for (float& x : values) x *= 100.0f;
      convert_from_f32(values.data(), t->view().data(), dtype, values.size());
    }
    if (dtype == DType::kF16) {  // V near f16's largest finite value, 65504
      std::vector<float> values(size_t(p.v.numel()));
      convert_to_f32(p.v.view().data(), dtype, values.data(), values.size());
      for (float& x : values) x = x > 0 ? 60000.0f : -60000.0f;
      convert_from_f32(values.data(), p.v.view().data(), dtype, values.size());
    }
    const AttentionInputs in = p.inputs();
    AttentionOutput out = impl()->forward(in, p.params());
    const ReferenceOutput ref = reference_attention_f64(in, p.params(), TokenPositions::dense(37, 53));
    double max_lse = 0;
    for (double x : ref.lse) max_lse = std::max(max_lse, std::fabs(x));
    ASSERT_GT(max_lse, 1000.0) << "the logits are not extreme";
    const Comparison cmp = compare(out.o, out.lse, ref, output_tolerance(dtype, max_abs_value(in.v)), 4e-7 * max_lse);
    EXPECT_EQ(cmp.nan, 0) << dtype_name(dtype);
    EXPECT_EQ(cmp.wrong, 0) << dtype_name(dtype) << ": max |error| " << cmp.max_abs_error << ", LSE " << cmp.max_lse_error;
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, ClosedForm,
                         testing::Values(std::pair{std::string("sdpa"), Backend::kCpu},
                                         std::pair{std::string("flash_attn2"), Backend::kCpu},
                                         std::pair{std::string("flash_attn2"), Backend::kNative},
                                         std::pair{std::string("blockwise"), Backend::kCpu}),
                         [](const auto& info) { return info.param.first + "_" + std::string(backend_name(info.param.second)); });

}  // namespace
}  // namespace ra::test
