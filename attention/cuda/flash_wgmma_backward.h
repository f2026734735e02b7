// The sm_90a (Hopper) flash_attn2 backward on warpgroup MMA (wgmma): the same contract as the mma.sync
// backward (dQ added into its f32 accumulator, this call's dK / dV added into theirs), every option:
// instances for positions and segment ids (causal, sliding window, documents, GQA, sinks through LSE),
// for a soft cap, and one that forms each pair with the bias, mask, dropout and soft cap (dBias by
// atomics); flash_cuda.cu's flash_uses_wgmma decides which kernel runs.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/cuda/flash_backward_cuda.h"
#include "runtime/dtype.h"

namespace ra {

// Expects q_len, kv_len > 0, head dims as check_flash_head_dims, f16 or bf16 (checked by the caller), with segment
// ids their ranges filled, and flash_wgmma_available().
// dq_slices: as flash_backward_cuda's (--deterministic): then the ordered kernel runs, this the scratch for its turns.
void flash_wgmma_backward(const FlashBackwardArgs& args, DType dtype, Tensor* dq_slices, cudaStream_t stream);

// Exact head dims of 192 and 256 with positions-only options (no segment ids, soft cap, bias, mask or dropout):
// dQ by a query-block kernel of its own beside the key-block kernel's dK / dV (flash_wgmma_backward_dq.cu),
// without the key-block kernel's dQ atomics; deterministic as it is, so --deterministic runs it too.
bool flash_wgmma_backward_dq_apart(const CudaAttentionArgs& a);
void flash_wgmma_backward_with_dq_apart(const FlashBackwardArgs& args, DType dtype, cudaStream_t stream);

// --deterministic: whether the ordered kernel runs (else the rounds of dQ slices). The slices were measured
// faster on the unsplit 128-column instance (D = 128 without the extras: H100, T = 32768, 1.42x the default
// backward against 1.68x, 1.63x against 1.82x with GQA); the ordered adds win at D = 64, 256, windows and
// documents (bench/RESULTS.md). Not asked where flash_wgmma_backward_dq_apart holds (deterministic as it is).
bool flash_wgmma_backward_orders_dq(const CudaAttentionArgs& a);

// --deterministic (flash_wgmma_backward_ordered.cu): each block of query rows takes its dQ adds from the key
// blocks in a fixed order; the turn counters and writer masks in `scratch` (grown as needed). Only for
// arguments flash_wgmma_backward_orders_dq takes (the others have no ordered instance).
void flash_wgmma_backward_ordered(const FlashBackwardArgs& args, DType dtype, Tensor* scratch, cudaStream_t stream);

}  // namespace ra
