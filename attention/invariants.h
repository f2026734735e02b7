// Cheap checks of attention inputs and outputs that catch corrupted data before it is used or
// written: non-finite inputs, and outputs outside what softmax weights can produce (each O row is a
// convex combination of V rows, so every feature lies within V's range over the visible keys).
#pragma once

#include <cstdint>

#include "attention/inputs.h"
#include "attention/params.h"
#include "collectives/communicator.h"

namespace ra {

// NaN and Inf values in a host tensor of any float dtype (0 for integer dtypes). With `minus_infinity_hides`, -inf
// is not counted: in a bias it hides its pair (PyTorch's float attn_mask), which every kernel takes as masked.
int64_t count_nonfinite(const TensorView& t, bool minus_infinity_hides = false);

// Throws with the first offending element unless every O feature lies within V's range over all
// keys of the sequence (reduced over `sequence_axis`, which holds the other K/V shards), widened to
// include 0 when sinks are present, by the dtype's tolerance; and every LSE is finite or -inf.
// Skipped under dropout (kept weights are rescaled and need not sum to one). Host tensors; collective.
void check_output_invariants(const AttentionInputs& in, const AttentionParams& params, const TensorView& o,
                             const TensorView& lse, Communicator& sequence_axis);

}  // namespace ra
