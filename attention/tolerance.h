// How far a result may be from the f64 reference: the stored output's rounding (2u of its dtype)
// plus f32 accumulation, scaled by the largest |v| (outputs are convex combinations of value rows).
#pragma once

#include <algorithm>

#include "runtime/dtype.h"

namespace ra {

inline double output_tolerance(DType dtype, double max_abs_v) {
  return (2.0 * dtype_unit_roundoff(dtype) + 2e-5) * std::max(1.0, max_abs_v);
}
// Gradients against the f64 reference, scaled by the largest reference gradient of the tensor: the
// stored gradient's rounding (2u of its dtype) plus f32 accumulation over the keys (or queries) and,
// where a kernel rounds P and dS to the input dtype before its matrix products (the GPU kernels), 8u
// of that dtype.
inline double gradient_tolerance(DType stored, double max_abs_reference, DType rounded_operands = DType::kF32) {
  const double rounding = rounded_operands == DType::kF32 ? 0.0 : 8.0 * dtype_unit_roundoff(rounded_operands);
  return (2.0 * dtype_unit_roundoff(stored) + rounding + 1e-4) * std::max(1e-3, max_abs_reference);
}
// Plus, element by element, what rounding leaves of terms that cancel, times the element's sum of |terms|
// (ReferenceGradients::*_terms): dS = P (dP - delta) subtracts two sums of |dO| |V| size whose difference
// may be far smaller (a softmax over one key, a constant V or K: dQ = dK = 0 exactly from terms of the
// inputs' size). 16 f32 units, and 2u of a dtype the kernel rounds operands to (its dS, and delta from an
// O stored in it).
inline double cancellation_tolerance(DType rounded_operands = DType::kF32) {
  const double rounded = rounded_operands == DType::kF32 ? 0.0 : 2.0 * dtype_unit_roundoff(rounded_operands);
  return 16.0 * dtype_unit_roundoff(DType::kF32) + rounded;
}
inline constexpr double kLseTolerance = 1e-4;  // natural-log units; f32 logits summed over <= 1M keys

}  // namespace ra
