#include "attention/compare.h"

#include <algorithm>
#include <cmath>

#include "attention/tolerance.h"

namespace ra {

Comparison compare(const TensorView& o, const TensorView& lse, const ReferenceOutput& ref, double tolerance,
                   double lse_tolerance) {
  Comparison c;
  for (int64_t i = 0; i < o.numel(); ++i) {
    const double x = load_as_f32(o.data(), o.dtype(), size_t(i)), r = ref.o[size_t(i)];
    if (std::isnan(x)) ++c.nan;
    const double e = std::fabs(x - r);
    c.max_abs_error = std::max(c.max_abs_error, std::isnan(e) ? INFINITY : e);
    c.max_rel_error = std::max(c.max_rel_error, e / std::max(std::fabs(r), 1e-3));
    if (!(e <= tolerance)) ++c.wrong;
  }
  for (int64_t i = 0; i < lse.numel(); ++i) {
    const double x = lse.data_as<float>()[i], r = ref.lse[size_t(i)];
    if (std::isnan(x)) ++c.nan;
    if (std::isinf(r) || std::isinf(x)) {
      if (x != r) ++c.wrong;
      continue;
    }
    const double e = std::fabs(x - r);
    c.max_lse_error = std::max(c.max_lse_error, e);
    if (!(e <= lse_tolerance)) ++c.wrong;
  }
  return c;
}

GradientComparison compare_gradient(const TensorView& got, const std::vector<double>& ref, DType rounded_operands,
                                    const std::vector<double>* terms) {
  GradientComparison c;
  for (double r : ref) c.max_abs_reference = std::max(c.max_abs_reference, std::fabs(r));
  const bool with_terms = terms != nullptr && terms->size() == ref.size();
  if (with_terms)
    for (double t : *terms) c.max_terms = std::max(c.max_terms, t);
  const double tolerance = gradient_tolerance(got.dtype(), c.max_abs_reference, rounded_operands);
  const double per_term = with_terms ? cancellation_tolerance(rounded_operands) : 0.0;
  c.tolerance = tolerance + per_term * c.max_terms;  // the largest element's
  if (got.numel() != int64_t(ref.size())) {
    c.wrong = std::max<int64_t>(1, int64_t(ref.size()));
    return c;
  }
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double x = load_as_f32(got.data(), got.dtype(), size_t(i));
    if (!std::isfinite(x)) ++c.nan;
    const double e = std::fabs(x - ref[size_t(i)]);
    c.max_abs_error = std::max(c.max_abs_error, std::isnan(e) ? INFINITY : e);
    if (!(e <= tolerance + (with_terms ? per_term * (*terms)[size_t(i)] : 0.0))) ++c.wrong;
  }
  return c;
}

}  // namespace ra
