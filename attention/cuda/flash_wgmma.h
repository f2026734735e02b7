// The sm_90a (Hopper) flash_attn2 forward on warpgroup MMA (wgmma): the same carry in / carry out
// contract as the mma.sync kernel in flash_cuda.cu, every option: instances for positions and segment
// ids (causal, sliding window, documents, GQA, sinks through the finalize), for a soft cap, and one that
// forms each logit with the bias, mask, dropout and soft cap; flash_cuda.cu decides which kernel runs.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/cuda/cuda_inputs.h"
#include "runtime/dtype.h"

namespace ra {

// True when this build holds sm_90a code for the kernel and the current device runs it.
bool flash_wgmma_available();

// Accumulates into args' carry. Expects q_len, kv_len > 0, head dims as check_flash_head_dims, f16 or bf16 (checked
// by the caller), and with segment ids their ranges filled.
void flash_wgmma_accumulate(const CudaAttentionArgs& args, DType dtype, cudaStream_t stream);

}  // namespace ra
