// The CUDA flash_attn2 forward: tensor-core tiles with the online softmax in registers, carry in and
// carry out in f32, so the ring calls it once per block. Two kernels, each with every option: mma.sync
// (sm_80 and later) and wgmma (sm_90a, faster); the wgmma one runs where it can. Both skip key tiles that share no segment with a query block (segment_ranges.h).
#pragma once

#include <cuda_runtime_api.h>

#include "attention/cuda/cuda_inputs.h"

namespace ra {

// Throws naming the tensor and what the kernel needs when it cannot run these inputs (dtype f16/bf16,
// head dims as check_flash_head_dims, contiguous last dim, 16-byte aligned rows), and names `sdpa` as the fallback.
void check_flash_cuda_supported(const AttentionInputs& in);

// The flash kernels take any head_dim (q, k) and v_head_dim (v) that are multiples of 8 up to 256; throws
// naming both and the fallbacks otherwise. `kernel` names the caller ("the cuda flash_attn2 backward").
void check_flash_head_dims(int64_t head_dim, int64_t value_dim, const char* kernel);

// True when the arguments use a bias, a mask or dropout: both flash kernels then run their extras
// instances, which form each logit pair by pair, but where they have a dropout instance
// (flash_takes_dropout_beside_positions) and where the wgmma kernels have a bias or mask instance, with dropout or
// without (flash_takes_bias_instance, flash_takes_mask_instance). A soft cap, beside segment ids or not, has
// instances of its own.
bool flash_has_extras(const CudaAttentionArgs& args);

// True when the wgmma kernels (forward and backward alike) run these arguments (args.flash_kernel, from
// AttentionParams): kAuto where this build and GPU have them (every option); kMmaSync never; kWgmma forced
// where they cannot run throws naming why.
bool flash_uses_wgmma(const CudaAttentionArgs& args);

void flash_accumulate_cuda(const CudaAttentionArgs& args, DType dtype, cudaStream_t stream);

}  // namespace ra
