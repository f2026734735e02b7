#include "attention/compare.h"

#include <algorithm>
#include <cmath>

#include "attention/params.h"
#include "attention/tolerance.h"
#include "attention/validate.h"

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
  for (int64_t i = 0; lse.defined() && i < lse.numel(); ++i) {  // (verify: an output of another library may lack lse)
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
                                    const std::vector<double>* terms, double logit_rounding,
                                    double partial_sum_rounding) {
  GradientComparison c;
  for (double r : ref) c.max_abs_reference = std::max(c.max_abs_reference, std::fabs(r));
  const bool with_terms = terms != nullptr && terms->size() == ref.size();
  if (with_terms)
    for (double t : *terms) c.max_terms = std::max(c.max_terms, t);
  // A logit's rounding moves P by that much relative, and the gradients with it (where terms cancel, P = 1 or
  // dP = delta hold whatever the logits: the terms' part covers those).
  const double tolerance = gradient_tolerance(got.dtype(), c.max_abs_reference, rounded_operands) +
                           4.0 * logit_rounding * c.max_abs_reference;
  const double per_term = with_terms ? cancellation_tolerance(rounded_operands) + partial_sum_rounding : 0.0;
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

namespace {

// The largest Euclidean norm of t's rows over its last dimension (any float dtype, any strides).
double max_row_norm(const TensorView& t) {
  const Tensor values = f32_copy(t);
  const float* x = values.data<float>();
  const int64_t width = t.dim(t.rank() - 1);
  double best = 0;
  for (int64_t row = 0; row * width < values.numel(); ++row) {
    double sum = 0;
    for (int64_t d = 0; d < width; ++d) sum += double(x[row * width + d]) * x[row * width + d];
    best = std::max(best, std::sqrt(sum));
  }
  return best;
}

}  // namespace

double logit_rounding(const AttentionInputs& in, const AttentionParams& params) {
  const int64_t D = in.q.dim(3);
  const double largest = effective_scale(params, D) * max_row_norm(in.q) * max_row_norm(in.k);
  double max_bias = 0;
  if (in.bias.defined()) {
    const Tensor bias = f32_copy(in.bias);
    for (int64_t i = 0; i < bias.numel(); ++i) max_bias = std::max(max_bias, double(std::fabs(bias.data<float>()[i])));
  }
  return 2.0 * std::sqrt(double(D)) * dtype_unit_roundoff(DType::kF32) * (largest + max_bias);
}

}  // namespace ra
