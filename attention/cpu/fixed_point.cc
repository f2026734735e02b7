#include "attention/cpu/fixed_point.h"

#include "attention/validate.h"
#include "runtime/error.h"

namespace ra {

int magnitude_exponent(const TensorView& t) {
  RA_CHECK(host_accessible(t.memory()), "magnitude_exponent needs a host tensor");
  const Tensor values = f32_copy(t);
  float max_abs = 0;
  for (int64_t i = 0; i < values.numel(); ++i) max_abs = std::fmax(max_abs, std::fabs(values.data<float>()[i]));
  if (max_abs == 0) return -126;
  int exponent = 0;
  std::frexp(max_abs, &exponent);  // max_abs = f * 2^exponent with f in [0.5, 1)
  return exponent;
}

}  // namespace ra
