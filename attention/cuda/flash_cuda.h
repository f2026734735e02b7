// The CUDA flash_attn2 forward: tensor-core (mma.sync m16n8k16) tiles of 128 queries x 64 keys,
// online softmax in registers, carry in and carry out in f32, so the ring calls it once per block.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/cuda/cuda_inputs.h"

namespace ra {

inline constexpr int64_t kFlashCudaHeadDims[] = {64, 128};

// Throws naming the tensor and what the kernel needs when it cannot run these inputs (dtype f16/bf16,
// D == Dv in {64, 128}, contiguous last dim, 16-byte aligned rows), and names `sdpa` as the fallback.
void check_flash_cuda_supported(const AttentionInputs& in);

void flash_accumulate_cuda(const CudaAttentionArgs& args, DType dtype, cudaStream_t stream);

}  // namespace ra
