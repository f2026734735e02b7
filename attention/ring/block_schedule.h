// The ring schedule as pure functions, shared by both rings and the tests; block classification
// (attention/block_kind.h) comes with it.
#pragma once

#include "attention/block_kind.h"

namespace ra {

// At step s of a ring of n ranks, rank r holds the K/V block that started on rank (r - s) mod n.
RA_HD_INLINE int ring_source_rank(int rank, int step, int n) { return ((rank - step) % n + n) % n; }

}  // namespace ra
