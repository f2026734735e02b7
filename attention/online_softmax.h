// Scalar pieces of online softmax shared by the CPU kernels, the carry merge and the CUDA kernels:
// the row state with its merge and normalize, the NaN-safe rescale factor, visibility of a (query,
// key) pair and dropout's decisions. Internal
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

// One row's online-softmax state (as flashinfer's state_t): the running max of the logits and the sum
// of exp(logit - max), in f32 (the carry, the kernels) or f64 (the oracle). The numerator (the
// weighted sum of V) lives beside it; merge and normalize say how to scale it.
template <typename Acc>
struct SoftmaxState {
  Acc max = -INFINITY, sum = 0;
};

RA_HD_INLINE float softmax_exp(float x) { return expf(x); }
RA_HD_INLINE double softmax_exp(double x) { return exp(x); }
RA_HD_INLINE float softmax_log(float x) { return logf(x); }
RA_HD_INLINE double softmax_log(double x) { return log(x); }

// The factors the two numerators are scaled by when two states merge: into = into * self + other * other.
template <typename Acc>
struct MergeScales {
  Acc self, other;
};

// into <- into (+) other (the state of the union of both key sets). Both empty: into stays empty and
// the scales are {1, 0}, so a numerator update leaves into's (zero) numerator as it is, never NaN. The
// sums still add there: keys whose logits were all NaN leave max -inf and a NaN sum, which must reach
// the normalize (NaN out, not an empty row's 0).
template <typename Acc>
RA_HD_INLINE MergeScales<Acc> softmax_merge(SoftmaxState<Acc>& into, SoftmaxState<Acc> other) {
  const Acc m = into.max > other.max ? into.max : other.max;
  if (m == -Acc(INFINITY)) {
    into.sum += other.sum;
    return {Acc(1), Acc(0)};
  }
  const Acc a = into.max == -Acc(INFINITY) ? Acc(0) : softmax_exp(into.max - m);
  const Acc b = other.max == -Acc(INFINITY) ? Acc(0) : softmax_exp(other.max - m);
  into.sum = into.sum * a + other.sum * b;
  into.max = m;
  return {a, b};
}

// Normalizing a finished row: O = numerator * scale and its LSE (natural log). An attention sink is one
// more logit with a zero value row: it joins the sum only, counted once here. A row with nothing (no
// visible key, no sink) gives scale 0 and LSE -inf: O = 0, never 0/0. A NaN sum (NaN logits: a NaN in q,
// k or the bias) is not an empty row: it stays NaN, as in PyTorch's SDPA, instead of a silent 0.
template <typename Acc>
struct Normalized {
  Acc scale, lse;
};
template <typename Acc>
RA_HD_INLINE Normalized<Acc> softmax_normalize(SoftmaxState<Acc> state, bool has_sink, Acc sink) {
  Acc numerator_scale = 1;
  if (has_sink) numerator_scale = softmax_merge(state, SoftmaxState<Acc>{sink, Acc(1)}).self;
  if (state.sum == Acc(0)) return {Acc(0), -Acc(INFINITY)};
  return {numerator_scale / state.sum, state.max + softmax_log(state.sum)};
}

// The sum of a row whose running max is still -inf: 0 where no logit was visible, NaN where every
// visible logit was NaN (a NaN in q): a max over floats skips NaN, and the row must not pass for empty.
template <typename Acc, typename Logit>
RA_HD_INLINE Acc unseen_row_sum(const Logit* logits, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    if (logits[j] != logits[j]) return Acc(NAN);
  return Acc(0);
}

// Causal / sliding-window visibility of key position kpos from query position qpos (-1: unbounded).
RA_HD_INLINE bool position_visible(int64_t qpos, int64_t kpos, bool causal, int64_t left, int64_t right) {
  if (causal && kpos > qpos) return false;
  if (left >= 0 && kpos < qpos - left) return false;
  if (right >= 0 && kpos > qpos + right) return false;
  return true;
}

// Dropout's decisions depend on the seed and the pair's global batch, head, query and key positions only, never on
// blocking or ring size. They come in three levels, so that a kernel forms each level once where it is shared:
//   head key = SplitMix64's finalizer over (seed, b, h), 32 bits of it  (once per batch and head);
//   row key  = MurmurHash3's 32-bit finalizer over the head key and the query's position  (once per query row);
//   key bits = that finalizer over the row key and the key's position with bit 3 cleared, whose low half decides
//              the key with bit 3 clear and its high half the key 8 further on.
// Keys 8 apart share one finalizer because an MMA fragment's thread holds both (its rows r and r + 8; its columns
// 8j + c and 8(j + 1) + c): a kernel whose keys start on a multiple of 16 hashes once for two pairs. A pair is
// dropped where its 16 bits fall below dropout_threshold(p): probability p to within 2^-17.

// MurmurHash3's finalizer in three parts. Its first step is linear in xor (fold(r ^ w) = fold(r) ^ fold(w)), so the
// pair kernels fold a row's key and a key's word apart, each once, and a pair's input costs one xor. Its last step
// (x ^= x >> 16) changes only the low half, so they stop before it (dropout_pair_bits).
RA_HD_INLINE uint32_t mix32_fold(uint32_t x) { return x ^ (x >> 16); }

RA_HD_INLINE uint32_t mix32_middle(uint32_t x) {
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  return x;
}

RA_HD_INLINE uint32_t mix32(uint32_t x) {
  x = mix32_middle(mix32_fold(x));
  return x ^ (x >> 16);
}

RA_HD_INLINE uint32_t dropout_head_key(uint64_t seed, int64_t b, int64_t h) {
  uint64_t x = seed ^ (uint64_t(b) * 0x9e3779b97f4a7c15ull) ^ (uint64_t(h) * 0xc2b2ae3d27d4eb4full);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return uint32_t(x >> 32);
}

// A position as one 32-bit word: its low half times an odd factor, xor its high half's term (positions past 2^32
// stay distinct from their low half). Consecutive positions under one high half step the word's product by the
// factor, which the pair kernels add instead of forming each word.
RA_HD_INLINE uint32_t dropout_position_high_term(int64_t position) {
  return uint32_t(uint64_t(position) >> 32) * 0x27d4eb2fu;
}
RA_HD_INLINE uint32_t dropout_position_word(int64_t position, uint32_t odd) {
  return uint32_t(uint64_t(position)) * odd ^ dropout_position_high_term(position);
}
inline constexpr uint32_t kDropoutKeyOdd = 0x85ebca77u;

RA_HD_INLINE uint32_t dropout_row_key(uint32_t head_key, int64_t q) {
  return mix32(head_key ^ dropout_position_word(q, 0x9e3779b1u));
}

// The word of keys k and k ^ 8 (bit 3 cleared): both pairs' decisions come from one finalizer.
RA_HD_INLINE uint32_t dropout_key_word(int64_t k) { return dropout_position_word(k & ~int64_t(8), kDropoutKeyOdd); }

RA_HD_INLINE uint32_t dropout_key_bits(uint32_t row_key, uint32_t key_word) { return mix32(row_key ^ key_word); }

// round(p * 2^16) in integers, the same on host and device (p * 2^32 is exact in floats, and a denormal p, which the
// device flushes to 0, gives 0 on the host too); p < 2^-17 drops nothing.
RA_HD_INLINE uint32_t dropout_threshold(float p) {
  if (!(p > 0.0f)) return 0u;
  if (p >= 1.0f) return 65536u;  // every pair
  const float scaled = p * 4294967296.0f;  // < 2^32 for p < 1
  return uint32_t((uint64_t(scaled) + 32768u) >> 16);
}

// The decisions of the two keys one finalizer serves: the one with bit 3 clear (low half), the one 8 further (high).
RA_HD_INLINE bool dropout_low_drops(uint32_t bits, uint32_t threshold) { return (bits & 0xffffu) < threshold; }
RA_HD_INLINE bool dropout_high_drops(uint32_t bits, uint32_t threshold) { return (bits >> 16) < threshold; }

// The same decisions as kernels that hold both keys take them (dropout_keys_pair_up), in fewer instructions: from
// the row key and the key word folded apart (mix32_fold), the finalizer stopped before its last step
// (dropout_pair_bits) and the threshold shifted to the high half (dropout_threshold_high). The high key's 16 bits are
// that value's high half, which the last step leaves as it is; the low key's are the xor of its two halves, compared
// in the high half too.
RA_HD_INLINE uint32_t dropout_pair_bits(uint32_t row_folded, uint32_t word_folded) {
  return mix32_middle(row_folded ^ word_folded);
}

// dropout_threshold(p) << 16, which only a threshold below 2^16 has (p below 1 - 2^-17; the pair kernels take no other).
RA_HD_INLINE uint32_t dropout_threshold_high(uint32_t threshold) { return threshold << 16; }

RA_HD_INLINE bool dropout_pair_low_drops(uint32_t pair_bits, uint32_t threshold_high) {
  return ((pair_bits << 16) ^ (pair_bits & 0xffff0000u)) < threshold_high;
}
RA_HD_INLINE bool dropout_pair_high_drops(uint32_t pair_bits, uint32_t threshold_high) {
  return pair_bits < threshold_high;
}

// Key position k's decision in row `row_key` (any k: the half is chosen by its bit 3).
RA_HD_INLINE bool dropout_drops(uint32_t row_key, int64_t k, uint32_t threshold) {
  const uint32_t bits = dropout_key_bits(row_key, dropout_key_word(k));
  return (k & 8) ? dropout_high_drops(bits, threshold) : dropout_low_drops(bits, threshold);
}

// One pair's decision from scratch (the reference paths, which form no level once).
RA_HD_INLINE bool dropout_drops(uint64_t seed, int64_t b, int64_t h, int64_t q, int64_t k, float p) {
  return dropout_drops(dropout_row_key(dropout_head_key(seed, b, h), q), k, dropout_threshold(p));
}

}  // namespace ra
