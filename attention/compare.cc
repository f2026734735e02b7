#include "attention/compare.h"

#include <algorithm>
#include <cmath>

#include "attention/params.h"
#include "attention/tolerance.h"
#include "attention/validate.h"

namespace ra {

Comparison compare(const TensorView& o, const TensorView& lse, const ReferenceOutput& ref, double tolerance,
                   double lse_tolerance, const std::vector<double>* row_rounding, double max_abs_v) {
  Comparison c;
  const int64_t T = o.dim(1), H = o.dim(2), Dv = o.dim(3);
  const auto rounding = [&](int64_t row) { return row_rounding ? (*row_rounding)[size_t(row)] : 0.0; };
  for (int64_t i = 0; i < o.numel(); ++i) {
    const double x = load_as_f32(o.data(), o.dtype(), size_t(i)), r = ref.o[size_t(i)];
    if (std::isnan(x)) ++c.nan;
    const double e = std::fabs(x - r);
    c.max_abs_error = std::max(c.max_abs_error, std::isnan(e) ? INFINITY : e);
    c.max_rel_error = std::max(c.max_rel_error, e / std::max(std::fabs(r), 1e-3));
    const int64_t b = i / (T * H * Dv), t = i / (H * Dv) % T, h = i / Dv % H;
    if (!(e <= tolerance + 2.0 * max_abs_v * rounding((b * H + h) * T + t))) ++c.wrong;
  }
  for (int64_t i = 0; lse.defined() && i < lse.numel(); ++i) {  // (verify: an output of another library may lack lse)
    const double x = lse.data_as<float>()[i], r = ref.lse[size_t(i)];
    if (std::isnan(x)) ++c.nan;
    if (std::isinf(r) || std::isinf(x)) {  // a row that sees no key: exactly -inf, unless f32 cannot resolve the row
      if (x != r && rounding(i) < kUnresolvedLogitRounding) ++c.wrong;  // (its logits overflow to -inf on the GPU)
      continue;
    }
    const double e = std::fabs(x - r);
    c.max_lse_error = std::max(c.max_lse_error, e);
    if (!(e <= lse_tolerance + rounding(i))) ++c.wrong;
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

std::vector<double> logit_rounding(const AttentionInputs& in, const AttentionParams& params,
                                   const std::vector<double>& reference_lse) {
  const int64_t D = in.q.dim(3), S = in.k.dim(1);
  const double unit = dtype_unit_roundoff(DType::kF32);
  const double dot = 2.0 * std::sqrt(double(D)) * unit * effective_scale(params, D) * max_row_norm(in.q) *
                     max_row_norm(in.k);
  std::vector<double> rounding(reference_lse.size(), 0.0);
  for (size_t i = 0; i < rounding.size(); ++i)
    if (std::isfinite(reference_lse[i]))
      rounding[i] = dot + 4.0 * unit * (std::fabs(reference_lse[i]) + 2.0 * std::log(double(S) + 1.0));
  return rounding;
}

}  // namespace ra
