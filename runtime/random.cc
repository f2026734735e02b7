// random_normal.
#include "runtime/random.h"

#include <vector>

namespace ra {

Tensor random_normal(DType dtype, const Shape& shape, std::mt19937_64& rng, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> values(static_cast<size_t>(shape.numel()));
  for (float& x : values) x = dist(rng);
  Tensor t(dtype, shape);
  convert_from_f32(values.data(), t.view().data(), dtype, values.size());
  return t;
}

}  // namespace ra
