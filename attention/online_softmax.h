// Scalar pieces of online softmax shared by the CPU kernels, the carry merge and the CUDA kernels:
// the NaN-safe rescale factor, visibility of a (query, key) pair and the dropout hash. Internal
// linkage on purpose: ISA-specific translation units include this and must not share copies.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define RA_HD_INLINE __host__ __device__ __forceinline__ static
#else
#define RA_HD_INLINE [[gnu::always_inline]] inline static
#endif

namespace ra {

// exp(old_max - new_max) with the -inf cases made explicit: a row that had seen nothing
// (old_max = -inf) contributes 0; if new_max is -inf too, nothing is visible yet and the factor is
// irrelevant (everything is 0), so return 0 instead of exp(-inf + inf) = NaN.
RA_HD_INLINE float rescale_factor(float old_max, float new_max) {
  return old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
}

// Causal / sliding-window visibility of key position kpos from query position qpos (-1: unbounded).
RA_HD_INLINE bool position_visible(int64_t qpos, int64_t kpos, bool causal, int64_t left, int64_t right) {
  if (causal && kpos > qpos) return false;
  if (left >= 0 && kpos < qpos - left) return false;
  if (right >= 0 && kpos > qpos + right) return false;
  return true;
}

// A uniform [0, 1) number from (seed, b, h, q, k): SplitMix64 finalizer over the packed coordinates,
// so a dropout decision depends on global positions only, never on blocking or ring size.
RA_HD_INLINE float dropout_uniform(uint64_t seed, int64_t b, int64_t h, int64_t q, int64_t k) {
  uint64_t x = seed ^ (uint64_t(b) * 0x9e3779b97f4a7c15ull) ^ (uint64_t(h) * 0xc2b2ae3d27d4eb4full) ^
               (uint64_t(q) * 0x165667b19e3779f9ull) ^ (uint64_t(k) * 0xd6e8feb86659fd93ull);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return float(x >> 40) * (1.0f / 16777216.0f);
}

}  // namespace ra
