// The CPU `blockwise` implementation: the seeds' scan-based blockwise attention. Queries in chunks
// of block_q; for each, a scan over key chunks of block_k, each chunk's carry merged into the running
// one (the same merge the ring uses between steps).
#pragma once

#include "attention/attention_impl.h"

namespace ra {

void blockwise_accumulate_cpu(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                              Carry& carry);
// The backward of the same scan: sdpa's backward per (query chunk, key chunk), chunk gradients summed.
void blockwise_accumulate_backward_cpu(const AttentionInputs& in, const TokenPositions& pos,
                                       const AttentionParams& params, const BackwardInputs& grad, const GradViews& acc);

// The inputs restricted to query rows [q0, q0 + nq) and key rows [k0, k0 + nk), with their positions.
// Bias and mask keep their global key columns.
AttentionInputs slice_inputs(const AttentionInputs& in, int64_t q0, int64_t nq, int64_t k0, int64_t nk,
                             int64_t total_keys);
TokenPositions slice_positions(const TokenPositions& pos, int64_t q0, int64_t nq, int64_t k0, int64_t nk);

}  // namespace ra
