// Bitwise-reproducible attention for the ring's --deterministic mode. Two passes over the key blocks:
// the first finds each row's exact maximum logit (max is order-independent), the second sums
// exp(logit - max) and its products with V in 128-bit fixed point (integer addition is associative).
// Each term is rounded on its own, so the result is the same bits however the keys are split into
// blocks and in whatever order the blocks arrive: 1, 2, 3 or N ranks, any layout.
#pragma once

#include <vector>

#include "attention/carry.h"
#include "attention/cpu/fixed_point.h"
#include "attention/inputs.h"
#include "attention/params.h"

namespace ra {

class ExactSum {
 public:
  // `value_exponent`: V is summed in units of 2^(value_exponent - 50); 2^value_exponent must bound
  // |v| over every key of the whole sequence (the same on every rank): magnitude_exponent's maximum.
  ExactSum(int64_t batch, int64_t heads, int64_t rows, int64_t value_dim, int value_exponent);

  void max_pass(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params);
  void sum_pass(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params);
  // carry <- carry (+) the result (rows that saw no key stay empty).
  void merge_into(Carry& carry) const;

 private:
  int64_t batch_, heads_, rows_, value_dim_;
  int value_exponent_;
  std::vector<float> max_;                       // (B, Hq, T)
  std::vector<Fixed> numerator_, denominator_;  // (B, Hq, T, Dv) and (B, Hq, T)
};

}  // namespace ra
