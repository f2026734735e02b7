#include "attention/cpu/fixed_point.h"

#include "attention/validate.h"
#include "runtime/error.h"

namespace ra {

int magnitude_exponent(const TensorView& t) {
  RA_CHECK(host_accessible(t.memory()), "magnitude_exponent needs a host tensor");
  const Tensor values = f32_copy(t);
  float max_abs = 0;
  for (int64_t i = 0; i < values.numel(); ++i) {
    const float x = values.data<float>()[i];
    if (!std::isfinite(x)) return kNonFiniteExponent;
    max_abs = std::fmax(max_abs, std::fabs(x));
  }
  if (max_abs == 0) return -126;
  int exponent = 0;
  std::frexp(max_abs, &exponent);  // max_abs = f * 2^exponent with f in [0.5, 1)
  return exponent;
}

void check_finite_for_exact_sums(const int64_t* exponents, const char* const* names, int count) {
  for (int i = 0; i < count; ++i)
    RA_CHECK(exponents[i] != kNonFiniteExponent, names[i], " holds NaN or Inf: the deterministic ring's fixed-point "
             "sums cannot carry them (run without --deterministic to have them propagate)");
}

}  // namespace ra
