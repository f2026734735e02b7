// Random tensors for samples, benchmarks and tests: normal values drawn in f32 and rounded once to
// the tensor's dtype, so every consumer sees exactly the stored values. One draw of `rng` seeds a
// counter-based stream: the same rng state gives the same bits for any number of OpenMP threads.
#pragma once

#include <random>

#include "runtime/tensor.h"

namespace ra {

Tensor random_normal(DType dtype, const Shape& shape, std::mt19937_64& rng, float stddev = 1.0f);

}  // namespace ra
