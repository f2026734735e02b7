// Comparing an attention result with the f64 reference, one rule for the tests and `ringattn verify`:
// an O element is wrong past `tolerance` (absolute; NaN is wrong), an LSE element past
// `lse_tolerance`, and an infinite LSE (an empty row) must match exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/cpu/sdpa_cpu.h"
#include "runtime/tensor.h"

namespace ra {

struct Comparison {
  double max_abs_error = 0, max_rel_error = 0, max_lse_error = 0;
  int64_t wrong = 0, nan = 0;
};

// o (any float dtype) and lse (f32) are contiguous host tensors in the reference's element order.
Comparison compare(const TensorView& o, const TensorView& lse, const ReferenceOutput& ref, double tolerance,
                   double lse_tolerance);

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

// How far f32 may round a logit of these (host) inputs: scale |q| |k| over the largest rows (Cauchy-Schwarz: at
// least the sum of |q_d k_d| a kernel rounds) plus the largest |bias|, times 2 sqrt(D) f32 units (a dot product's
// rounding, with margin). Large logits (unnormalised activations) move P, and with it O, LSE and the gradients, by
// that much relative, however exact the kernel: tolerances add it (LSE: itself; O: 2 max|V| times it; a gradient:
// 4 times it, times its largest value). Near zero for unit-scale inputs.
double logit_rounding(const AttentionInputs& in, const AttentionParams& params);

}  // namespace ra
