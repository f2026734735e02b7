// random_normal: a counter-based generator (each pair of values is a function of the call's seed and
// the pair's index), so the values do not depend on how many threads fill the tensor, and a billion
// values (q, k and v of a million tokens on one rank) take seconds instead of minutes.
#include "runtime/random.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ra {
namespace {

// splitmix64's finalizer: consecutive inputs give independent-looking 64-bit outputs.
uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Pair `index` of the stream `seed`: two standard normal values (Box-Muller on two 24-bit uniforms,
// in float: test and benchmark data need no more; |z| stays below 5.8).
void normal_pair(uint64_t seed, uint64_t index, float& a, float& b) {
  const uint64_t bits = mix(seed + (index + 1) * 0x9e3779b97f4a7c15ULL);
  constexpr float kUnit = 1.0f / 16777216.0f;
  const float u1 = (float(bits >> 40) + 1.0f) * kUnit;           // (0, 1]: the log stays finite
  const float u2 = float((bits >> 8) & 0xffffffULL) * kUnit;     // [0, 1)
  const float r = std::sqrt(-2.0f * std::log(u1)), angle = 2.0f * std::numbers::pi_v<float> * u2;
  a = r * std::cos(angle);
  b = r * std::sin(angle);
}

}  // namespace

Tensor random_normal(DType dtype, const Shape& shape, std::mt19937_64& rng, float stddev) {
  const uint64_t seed = rng();  // one draw per call: successive calls differ, the same rng repeats
  Tensor t(dtype, shape);
  const int64_t n = shape.numel();
  constexpr int64_t kChunk = 4096;  // even, so a chunk holds whole pairs
  char* out = static_cast<char*>(t.view().data());
  const size_t element = dtype_size(dtype);
#pragma omp parallel for schedule(static)
  for (int64_t start = 0; start < n; start += kChunk) {
    float values[kChunk];
    const int64_t count = std::min(kChunk, n - start);
    for (int64_t i = 0; i < count; i += 2) {
      float a, b;
      normal_pair(seed, uint64_t(start + i) / 2, a, b);
      values[i] = a * stddev;
      if (i + 1 < count) values[i + 1] = b * stddev;
    }
    convert_from_f32(values, out + size_t(start) * element, dtype, size_t(count));
  }
  return t;
}

}  // namespace ra
