// Comparing an attention result with the f64 reference, one rule for the tests and `ringattn verify`:
// an O element is wrong past `tolerance` (absolute; NaN is wrong), an LSE element past
// `lse_tolerance`, and an infinite LSE (an empty row) must match exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/cpu/sdpa_cpu.h"
#include "runtime/tensor.h"

namespace ra {

// Past this, f32's rounding of a row's logits moves its probabilities by a tenth or more: no f32 kernel resolves
// them, and the row's check allows any convex combination of V, and an LSE of -inf (logits of -3.4e38, finfo.min,
// overflow to -inf in a kernel's log2 units: the row then sees no key); verify says so.
inline constexpr double kUnresolvedLogitRounding = 0.1;

struct Comparison {
  double max_abs_error = 0, max_rel_error = 0, max_lse_error = 0;
  int64_t wrong = 0, nan = 0;
};

// o (any float dtype) and lse (f32) are contiguous host tensors in the reference's element order.
// row_rounding (lse's layout, logit_rounding's), where given, widens each row's O by 2 max|V| times its value and
// its LSE by the value.
Comparison compare(const TensorView& o, const TensorView& lse, const ReferenceOutput& ref, double tolerance,
                   double lse_tolerance, const std::vector<double>* row_rounding = nullptr, double max_abs_v = 0);

// A gradient (contiguous host tensor, any float dtype) against the f64 reference's, with the tolerance
// of attention/tolerance.h for its dtype (rounded_operands: the dtype a kernel rounds P / dS to; terms:
// the reference's sums of |terms| for these elements, where it gives them; partial_sum_rounding: the relative
// rounding the partial sums met on the way, allowed per element against its terms, e.g. a ring's bf16 wire:
// its hops x bf16's unit).
struct GradientComparison {
  double max_abs_error = 0, max_abs_reference = 0, max_terms = 0, tolerance = 0;
  int64_t wrong = 0, nan = 0;
};
GradientComparison compare_gradient(const TensorView& got, const std::vector<double>& ref,
                                    DType rounded_operands = DType::kF32, const std::vector<double>* terms = nullptr,
                                    double logit_rounding = 0.0, double partial_sum_rounding = 0.0);

// How far f32 may round the logits that carry each query row's weight (host inputs; reference_lse: the f64
// reference's, (B, Hq, T)), as a relative change of the row's probabilities: a dot product's rounding, scale |q|
// |k| over the largest rows (Cauchy-Schwarz: at least the sum of |q_d k_d| a kernel rounds) times 2 sqrt(D) f32
// units, plus the roundings of the logit itself (bias added, scaled, shifted), 4 units of its size where it has
// weight (p-weighted, sum_j p_j |s_j| <= |lse| + 2 log S), whatever a bias adds to the pairs it hides (-1e9 or -inf
// give them no weight). Large logits (unnormalised activations) move P, and with it O, LSE and the gradients, by
// that much relative, however exact the kernel: tolerances add it (LSE: itself; O: 2 max|V| times it; a gradient:
// 4 times it, times its largest value). Near zero for unit-scale inputs; 0 for a row that sees no key. A row whose
// keys a large finite bias hides all alike (HF's -1e9 or finfo.min over a padded query) has logits of that size:
// f32 cannot resolve its P.
std::vector<double> logit_rounding(const AttentionInputs& in, const AttentionParams& params,
                                   const std::vector<double>& reference_lse);

}  // namespace ra
