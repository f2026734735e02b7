// Dropout's decisions (attention/online_softmax.h): the threshold is round(p 2^16) exactly, the levels a kernel
// forms once (keys 8 apart sharing one finalizer's halves) give the decision formed from scratch, and the decisions
// behave as independent draws of probability p: by rows, by keys, by heads and batch entries, by seeds, and between
// neighbouring pairs, the keys that share a finalizer among them.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention/online_softmax.h"

namespace ra::test {
namespace {

TEST(Dropout, ThresholdIsPTimesTwoToThe16Rounded) {
  EXPECT_EQ(dropout_threshold(0.0f), 0u);
  EXPECT_EQ(dropout_threshold(-0.5f), 0u);
  EXPECT_EQ(dropout_threshold(NAN), 0u);
  EXPECT_EQ(dropout_threshold(1e-40f), 0u);  // a denormal, which a device flushes to 0
  EXPECT_EQ(dropout_threshold(1.0f), 65536u);
  EXPECT_EQ(dropout_threshold(0.5f), 32768u);
  EXPECT_EQ(dropout_threshold(0.25f), 16384u);
  EXPECT_EQ(dropout_threshold(7.0f / 131072), 4u);  // 3.5 rounds half up
  for (float p : {0.1f, 0.125f, 0.3f, 0.7f, 1e-6f, 3e-9f, 1e-5f, 0.99999994f}) {
    const double exact = std::floor(double(p) * 65536.0 + 0.5);
    EXPECT_EQ(double(dropout_threshold(p)), exact) << p;
    EXPECT_LE(std::fabs(double(dropout_threshold(p)) / 65536.0 - double(p)), 1.0 / 131072) << p;
  }
}

TEST(Dropout, LevelsGiveTheDecisionFromScratch) {
  const uint32_t threshold = dropout_threshold(0.4f);
  for (int64_t q : {int64_t(0), int64_t(7), int64_t(1) << 33})
    for (int64_t k : {int64_t(0), int64_t(5), int64_t(13), (int64_t(1) << 32) + 5, (int64_t(1) << 32) + 24}) {
      const uint32_t row = dropout_row_key(dropout_head_key(11, 2, 3), q);
      EXPECT_EQ(dropout_drops(11, 2, 3, q, k, 0.4f), dropout_drops(row, k, threshold));
      // Keys k and k ^ 8 are the low and high halves of one finalizer, as the kernels form them.
      const int64_t low = k & ~int64_t(8), high = low + 8;
      const uint32_t bits = dropout_key_bits(row, dropout_key_word(low));
      EXPECT_EQ(dropout_key_word(low), dropout_key_word(high));
      EXPECT_EQ(dropout_drops(11, 2, 3, q, low, 0.4f), dropout_low_drops(bits, threshold));
      EXPECT_EQ(dropout_drops(11, 2, 3, q, high, 0.4f), dropout_high_drops(bits, threshold));
    }
  // Positions past 2^32 do not repeat their low half's decisions.
  int differ = 0;
  for (int64_t k = 0; k < 256; ++k)
    differ += dropout_drops(1, 0, 0, 9, k, 0.5f) != dropout_drops(1, 0, 0, 9, k + (int64_t(1) << 32), 0.5f);
  EXPECT_GT(differ, 90);
}

// The pair kernels step a run's key words by the odd factor under one high half (drop_keyed): the words they add up
// are the words of the positions, below 2^32 and past it.
TEST(Dropout, ConsecutiveKeysWordsStepByTheOddFactor) {
  for (int64_t first : {int64_t(0), int64_t(4096), (int64_t(1) << 32) + 48, (int64_t(7) << 32) - 256}) {
    const uint32_t high = dropout_position_high_term(first);
    for (uint32_t u = 0; u < 256; u += (u % 16 == 7 ? 9 : 1)) {  // the columns whose bit 3 is clear
      const int64_t k = first + u;
      EXPECT_EQ((uint32_t(uint64_t(first)) + u) * kDropoutKeyOdd ^ high, dropout_key_word(k)) << first << " + " << u;
      // Folded apart (the high half's term into the rows' keys), as the kernels fold them.
      const uint32_t low_word = (uint32_t(uint64_t(first)) + u) * kDropoutKeyOdd;
      EXPECT_EQ(mix32_fold(dropout_key_word(k)), mix32_fold(low_word) ^ mix32_fold(high)) << first << " + " << u;
    }
  }
}

TEST(Dropout, PairFormGivesTheHalvesDecisionsAtEveryThresholdBelowTwoToThe16) {
  // The pair kernels' form (the finalizer before its last step, the threshold in the high half) against the two
  // halves of the whole finalizer: every threshold they take, on hashed inputs and on the halves' edges.
  std::vector<uint32_t> inputs;
  for (uint32_t i = 0; i < 2000; ++i) inputs.push_back(mix32(i * 2654435761u + 1));
  for (uint32_t edge : {0u, 1u, 0xffffu, 0x10000u, 0xffff0000u, 0xffffffffu, 0x8000u, 0x80008000u}) inputs.push_back(edge);
  for (uint32_t threshold = 0; threshold < 65536u; threshold += 7) {
    const uint32_t high_threshold = dropout_threshold_high(threshold);
    for (uint32_t before_last : inputs) {
      const uint32_t bits = before_last ^ (before_last >> 16);  // mix32's last step
      ASSERT_EQ(dropout_pair_low_drops(before_last, high_threshold), dropout_low_drops(bits, threshold))
          << threshold << " " << before_last;
      ASSERT_EQ(dropout_pair_high_drops(before_last, high_threshold), dropout_high_drops(bits, threshold))
          << threshold << " " << before_last;
    }
  }
  for (uint32_t x : inputs) {
    const uint32_t before_last = mix32_middle(mix32_fold(x));
    EXPECT_EQ(mix32(x), before_last ^ (before_last >> 16));
  }
  // The row key and the key word folded apart give the finalizer of their xor.
  const uint32_t row = dropout_row_key(dropout_head_key(5, 1, 2), 77), word = dropout_key_word(48);
  const uint32_t pair_bits = dropout_pair_bits(mix32_fold(row), mix32_fold(word));
  EXPECT_EQ(pair_bits ^ (pair_bits >> 16), dropout_key_bits(row, word));
}

// The fraction of n draws dropped, within 5 standard deviations of p.
void expect_rate(const std::vector<bool>& dropped, double p, const char* what) {
  double count = 0;
  for (bool d : dropped) count += d;
  const double n = double(dropped.size()), sigma = std::sqrt(p * (1 - p) / n);
  EXPECT_NEAR(count / n, p, 5 * sigma) << what;
}

TEST(Dropout, DecisionsAreDrawsOfProbabilityP) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    std::vector<bool> pairs, first_keys, heads, seeds;
    for (int64_t q = 0; q < 300; ++q)
      for (int64_t k = 0; k < 300; ++k) pairs.push_back(dropout_drops(7, 0, 0, q, k, p));
    for (int64_t q = 0; q < 20000; ++q) first_keys.push_back(dropout_drops(7, 0, 0, q, 0, p));  // one key, many rows
    for (int64_t h = 0; h < 20000; ++h) heads.push_back(dropout_drops(7, h % 8, h / 8, 3, 4, p));  // one pair
    for (uint64_t seed = 0; seed < 20000; ++seed) seeds.push_back(dropout_drops(seed, 0, 0, 3, 4, p));
    expect_rate(pairs, p, "pairs");
    expect_rate(first_keys, p, "rows");
    expect_rate(heads, p, "batch and heads");
    expect_rate(seeds, p, "seeds");
  }
}

TEST(Dropout, NeighbouringDecisionsAreIndependent) {
  // P(both dropped) = p^2 for neighbours along keys (1 apart, and 8 apart: one finalizer's two halves), along
  // queries, across heads and across seeds.
  const float p = 0.3f;
  for (int axis = 0; axis < 5; ++axis) {
    std::vector<bool> both;
    for (int64_t q = 0; q < 200; ++q)
      for (int64_t k = 0; k < 200; ++k) {
        const bool here = dropout_drops(5, 1, 2, q, k, p);
        const bool next = axis == 0   ? dropout_drops(5, 1, 2, q, k + 1, p)
                          : axis == 1 ? dropout_drops(5, 1, 2, q + 1, k, p)
                          : axis == 2 ? dropout_drops(5, 1, 3, q, k, p)
                          : axis == 3 ? dropout_drops(6, 1, 2, q, k, p)
                                      : dropout_drops(5, 1, 2, q, k ^ 8, p);
        both.push_back(here && next);
      }
    expect_rate(both, double(p) * p, "neighbours");
  }
}

}  // namespace
}  // namespace ra::test
