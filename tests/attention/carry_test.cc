// The carry: merging with an empty carry is exact, and splitting K/V into any number of blocks,
// accumulating each into its own carry and merging, equals the single-block result.
#include <gtest/gtest.h>

#include <cmath>

#include "attention/cpu/blockwise_cpu.h"
#include "attention/carry.h"
#include "attention/registry.h"
#include "tests/support/problem.h"

namespace ra::test {
namespace {

Carry random_carry(int64_t rows, uint64_t seed) {
  Problem p(ProblemSpec{1, rows, 40, 2, 2, 16, 16, DType::kF32, {}, seed});
  Carry c = Carry::empty(1, 2, rows, 16);
  AttentionRegistry::builtin().create("sdpa", Backend::kCpu)->accumulate(p.inputs(), TokenPositions::dense(rows, 40),
                                                                          p.params(), c);
  return c;
}

TEST(Carry, EmptyCarryHasMinusInfMaxAndZeros) {
  Carry c = Carry::empty(2, 3, 5, 4);
  for (int64_t i = 0; i < c.row_count(); ++i) {
    EXPECT_EQ(c.max.data<float>()[i], -INFINITY);
    EXPECT_EQ(c.denominator.data<float>()[i], 0.0f);
  }
}

TEST(Carry, MergeWithEmptyIsExactBothWays) {
  Carry a = random_carry(9, 3);
  Carry left = Carry::empty(1, 2, 9, 16);
  merge(left, a);  // empty (+) a
  Carry right = random_carry(9, 3);
  merge(right, Carry::empty(1, 2, 9, 16));  // a (+) empty
  for (int64_t i = 0; i < a.numerator.numel(); ++i) {
    EXPECT_EQ(left.numerator.data<float>()[i], a.numerator.data<float>()[i]);
    EXPECT_EQ(right.numerator.data<float>()[i], a.numerator.data<float>()[i]);
  }
  for (int64_t i = 0; i < a.row_count(); ++i) {
    EXPECT_EQ(left.max.data<float>()[i], a.max.data<float>()[i]);
    EXPECT_EQ(left.denominator.data<float>()[i], a.denominator.data<float>()[i]);
  }
}

TEST(Carry, MergeOfTwoEmptiesStaysEmptyWithoutNan) {
  Carry a = Carry::empty(1, 1, 3, 2);
  merge(a, Carry::empty(1, 1, 3, 2));
  Tensor o(DType::kF32, {1, 3, 1, 2}), lse(DType::kF32, {1, 1, 3});
  finalize(a, TensorView(), o, lse);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(o.data<float>()[i], 0.0f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lse.data<float>()[i], -INFINITY);
}

// A row whose visible logits were all NaN (a NaN in q) keeps max -inf beside a NaN sum: merged with an
// empty carry either way round it stays NaN, and finalizes to NaN, not to an empty row's 0 / -inf.
TEST(Carry, RowOfNanLogitsStaysNanThroughMergeAndFinalize) {
  for (bool nan_first : {true, false}) {
    Carry nan_row = Carry::empty(1, 1, 1, 2), empty = Carry::empty(1, 1, 1, 2);
    nan_row.denominator.data<float>()[0] = NAN;
    Carry& into = nan_first ? nan_row : empty;
    merge(into, nan_first ? empty : nan_row);
    Tensor o(DType::kF32, {1, 1, 1, 2}), lse(DType::kF32, {1, 1, 1});
    finalize(into, TensorView(), o, lse);
    EXPECT_TRUE(std::isnan(lse.data<float>()[0])) << "NaN row merged " << (nan_first ? "into" : "from") << " empty";
    EXPECT_TRUE(std::isnan(o.data<float>()[0]) && std::isnan(o.data<float>()[1]));
  }
}

// Split points of S into n uneven pieces.
std::vector<int64_t> split_points(int64_t s, int n, uint64_t seed) {
  std::vector<int64_t> cuts{0};
  for (int i = 1; i < n; ++i) cuts.push_back(s * i / n + int64_t((seed * 31 + i * 7) % 5) - 2);
  cuts.push_back(s);
  return cuts;
}

class SplitMerge : public testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(SplitMerge, BlocksMergedEqualSingleBlock) {
  auto [impl_name, pieces] = GetParam();
  ProblemSpec spec{1, 90, 141, 4, 2, 64, 64};
  spec.options = Options{true, false, true, true, true, true, true, false};
  Problem p(spec);
  auto impl = AttentionRegistry::builtin().create(impl_name, Backend::kCpu);
  AttentionInputs in = p.inputs();
  TokenPositions pos = TokenPositions::dense(90, 141);
  Carry whole = Carry::empty(1, 4, 90, 64);
  impl->accumulate(in, pos, p.params(), whole);

  Carry merged = Carry::empty(1, 4, 90, 64);
  std::vector<int64_t> cuts = split_points(141, pieces, uint64_t(pieces));
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const int64_t k0 = cuts[i], nk = cuts[i + 1] - cuts[i];
    Carry part = Carry::empty(1, 4, 90, 64);
    impl->accumulate(slice_inputs(in, 0, 90, k0, nk, 141), slice_positions(pos, 0, 90, k0, nk), p.params(), part);
    merge(merged, part);
  }
  Tensor o1(DType::kF32, {1, 90, 4, 64}), o2(DType::kF32, {1, 90, 4, 64});
  Tensor l1(DType::kF32, {1, 4, 90}), l2(DType::kF32, {1, 4, 90});
  finalize(whole, in.sinks, o1, l1);
  finalize(merged, in.sinks, o2, l2);
  for (int64_t i = 0; i < o1.numel(); ++i) ASSERT_NEAR(o1.data<float>()[i], o2.data<float>()[i], 2e-6) << i;
  for (int64_t i = 0; i < l1.numel(); ++i) {
    if (std::isinf(l1.data<float>()[i])) {
      ASSERT_EQ(l1.data<float>()[i], l2.data<float>()[i]);
    } else {
      ASSERT_NEAR(l1.data<float>()[i], l2.data<float>()[i], 2e-6 * std::max(1.0f, std::fabs(l1.data<float>()[i])));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, SplitMerge,
                         testing::Combine(testing::Values("sdpa", "flash_attn2"), testing::Values(1, 2, 3, 5, 7)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "_blocks";
                         });

}  // namespace
}  // namespace ra::test
