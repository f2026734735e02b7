// The exact-sum mode of the ring (attention/cpu/exact_sum_cpu): keys cut into uneven blocks and visited in
// a shuffled order give the same bits as one block, and the result matches the f64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "attention/cpu/blockwise_cpu.h"
#include "attention/cpu/exact_sum_cpu.h"
#include "tests/support/problem.h"
#include "tests/support/same_bits.h"

namespace ra::test {
namespace {

// O and LSE of the exact sum over K/V cut at `cuts` (sorted, inside (0, S)), blocks in `order`.
AttentionOutput exact_over_blocks(const Problem& p, std::vector<int64_t> cuts, uint64_t shuffle_seed) {
  const AttentionInputs in = p.inputs();
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), S = in.k.dim(1), Dv = in.v.dim(3);
  const TokenPositions pos = TokenPositions::dense(T, S);
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(S);
  std::vector<size_t> order(cuts.size() - 1);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(shuffle_seed));
  ExactSum exact(B, Hq, T, Dv, magnitude_exponent(in.v));
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i : order) {
      const int64_t k0 = cuts[i], nk = cuts[i + 1] - cuts[i];
      const AttentionInputs block = slice_inputs(in, 0, T, k0, nk, S);
      const TokenPositions block_pos = slice_positions(pos, 0, T, k0, nk);
      pass == 0 ? exact.max_pass(block, block_pos, p.params()) : exact.sum_pass(block, block_pos, p.params());
    }
  Carry carry = Carry::empty(B, Hq, T, Dv);
  exact.merge_into(carry);
  AttentionOutput out{Tensor(in.q.dtype(), Shape{B, T, Hq, Dv}), Tensor(DType::kF32, Shape{B, Hq, T})};
  finalize(carry, in.sinks, out.o, out.lse);
  return out;
}

TEST(ExactSum, BlockCutsAndOrderDoNotChangeTheBits) {
  for (const Options& o : option_sets()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      Problem p(ProblemSpec{2, 37, 53, 4, 2, 24, 16, dtype, o, 11});
      const AttentionOutput whole = exact_over_blocks(p, {}, 0);
      const AttentionOutput cut = exact_over_blocks(p, {1, 9, 30, 31, 52}, 5);
      EXPECT_TRUE(same_bits(whole.o, cut.o)) << o.name() << " " << dtype_name(dtype);
      EXPECT_TRUE(same_bits(whole.lse, cut.lse)) << o.name() << " " << dtype_name(dtype);
      const ReferenceOutput ref = reference_attention_f64(p.inputs(), p.params(), TokenPositions::dense(37, 53));
      const double scale = o.dropout ? 1.0 / (1.0 - p.params().dropout_prob) : 1.0;
      const Comparison cmp = compare(whole.o, whole.lse, ref, output_tolerance(dtype, max_abs_value(p.inputs().v) * scale),
                                     kLseTolerance);
      EXPECT_EQ(cmp.nan, 0) << o.name();
      EXPECT_EQ(cmp.wrong, 0) << o.name() << " " << dtype_name(dtype) << " max |err| " << cmp.max_abs_error;
    }
  }
}

TEST(ExactSum, ValueExponentBoundsEveryValue) {
  float values[4] = {0.25f, -3.0f, 1.0f, 0.0f};
  EXPECT_EQ(magnitude_exponent(TensorView(values, DType::kF32, Shape{1, 2, 1, 2})), 2);  // 3 <= 2^2
  float zeros[2] = {0, 0};
  EXPECT_EQ(magnitude_exponent(TensorView(zeros, DType::kF32, Shape{1, 1, 1, 2})), -126);
  float with_nan[3] = {1.0f, NAN, 2.0f}, with_inf[2] = {-INFINITY, 0.5f};
  EXPECT_EQ(magnitude_exponent(TensorView(with_nan, DType::kF32, Shape{3})), kNonFiniteExponent);  // any rank
  EXPECT_EQ(magnitude_exponent(TensorView(with_inf, DType::kF32, Shape{1, 2})), kNonFiniteExponent);
}

}  // namespace
}  // namespace ra::test
