// How far a result may be from the f64 reference: the stored output's rounding (2u of its dtype)
// plus f32 accumulation, scaled by the largest |v| (outputs are convex combinations of value rows).
#pragma once

#include <algorithm>

#include "runtime/dtype.h"

namespace ra {

inline double output_tolerance(DType dtype, double max_abs_v) {
  return (2.0 * dtype_unit_roundoff(dtype) + 2e-5) * std::max(1.0, max_abs_v);
}
inline constexpr double kLseTolerance = 1e-4;  // natural-log units; f32 logits summed over <= 1M keys

}  // namespace ra
