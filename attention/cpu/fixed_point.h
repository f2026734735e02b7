// Fixed-point sums for the deterministic ring (forward and backward): each term is rounded to an
// integer count of its sum's unit on its own, and integer addition is associative, so a sum is the same
// bits in any order and however its terms are split into blocks and ranks.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/tensor.h"

namespace ra {

using Fixed = __int128;

// A term scaled by its unit must stay below 2^62 (one llrint); an int128 sum then holds 2^65 terms.
constexpr double kFixedTermLimit = 0x1p62;

// x in units of 1 / unit (unit a power of two, so x * unit is exact), rounded to the nearest integer;
// the caller keeps |x * unit| below kFixedTermLimit.
inline int64_t to_fixed(double x, double unit) { return std::llrint(x * unit); }

// sum += x in units of 1 / unit; false (and nothing added) when x is out of the unit's range or not finite.
inline bool fixed_add(Fixed& sum, double x, double unit) {
  const double scaled = x * unit;
  if (!(std::fabs(scaled) < kFixedTermLimit)) return false;
  sum += std::llrint(scaled);
  return true;
}

// count * 2^exponent, rounded to f32 (through long double, whose 64-bit mantissa holds most sums exactly).
inline float fixed_to_float(Fixed count, int exponent) {
  return float(std::ldexp(static_cast<long double>(count), exponent));
}

// The smallest e with |x| < 2^e for every element of `t` (host, any float dtype, any rank); -126 when t
// is all zeros; kNonFiniteExponent when it holds NaN or Inf (fixed-point sums cannot carry them).
constexpr int kNonFiniteExponent = 1 << 20;
int magnitude_exponent(const TensorView& t);

// Refuses, naming the tensor, where `exponents` (magnitude_exponent's, the maximum over the ranks, so
// that every rank refuses alike) mark non-finite values.
void check_finite_for_exact_sums(const int64_t* exponents, const char* const* names, int count);

}  // namespace ra
