// Block classification as a pure function, shared by the kernels (CPU flash, CUDA flash tiles,
// cudnn), the ring's schedule and the tests. Internal linkage, see online_softmax.h.
#pragma once

#include <cstdint>

#include "attention/online_softmax.h"

namespace ra {

enum class BlockKind : uint8_t { kSkip, kFull, kPartial };

// A (query block, key block) pair from the ranges of their positions [q_lo, q_hi] and [k_lo, k_hi]:
// skipped when no pair can be visible (all keys in the future, or outside the window), full when
// every pair is visible, partial (a diagonal or window edge) otherwise.
RA_HD_INLINE BlockKind classify_block(int64_t q_lo, int64_t q_hi, int64_t k_lo, int64_t k_hi, bool causal,
                                      int64_t left, int64_t right) {
  if (causal && k_lo > q_hi) return BlockKind::kSkip;
  if (right >= 0 && k_lo > q_hi + right) return BlockKind::kSkip;
  if (left >= 0 && k_hi < q_lo - left) return BlockKind::kSkip;
  bool full = true;
  if (causal && k_hi > q_lo) full = false;
  if (right >= 0 && k_hi > q_lo + right) full = false;
  if (left >= 0 && k_lo < q_hi - left) full = false;
  return full ? BlockKind::kFull : BlockKind::kPartial;
}

// The same pair from the ranges of their segment ids: skipped when the ranges do not meet (no query
// shares a segment with any key), full when both sides hold one segment, the same one.
RA_HD_INLINE BlockKind classify_segments(int64_t q_lo, int64_t q_hi, int64_t k_lo, int64_t k_hi) {
  if (k_hi < q_lo || k_lo > q_hi) return BlockKind::kSkip;
  return q_lo == q_hi && k_lo == k_hi ? BlockKind::kFull : BlockKind::kPartial;
}

// A pair that two tests classified: visible only where both see it, whole only where both do.
RA_HD_INLINE BlockKind both_kinds(BlockKind a, BlockKind b) {
  if (a == BlockKind::kSkip || b == BlockKind::kSkip) return BlockKind::kSkip;
  return a == BlockKind::kFull && b == BlockKind::kFull ? BlockKind::kFull : BlockKind::kPartial;
}

}  // namespace ra
