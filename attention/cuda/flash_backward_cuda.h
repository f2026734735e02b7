// The CUDA flash_attn2 backward (FlashAttention-2's algorithm): one block owns 128 keys of one (batch,
// K/V head) and walks the query blocks of every query head of its group, keeping dK and dV in
// registers; dQ is added to its f32 accumulator with atomics. Two kernels: mma.sync (sm_80 and later,
// every option) and wgmma (sm_90a, positions and segment ids), chosen as the forward's (flash_cuda.h).
// Both skip the query blocks that share no segment with a key block (segment_ranges.h).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "attention/backward.h"
#include "attention/cuda/cuda_inputs.h"
#include "runtime/tensor.h"

namespace ra {

struct FlashBackwardArgs {
  CudaAttentionArgs a;   // inputs, positions and options (no carry)
  DeviceView4 d_o;       // (B, T, Hq, Dv), q's dtype, contiguous last dimension
  const float* lse;      // (B, Hq, T)
  const float* delta;    // (B, Hq, T)
  float *dq, *dk, *dv;   // contiguous f32 accumulators shaped as q, k, v
  DeviceView4 dbias;     // broadcast to (B, Hq, T, S_total); data null without a bias
  // A single call's dK and dV in the input dtype, contiguous as k and v: when set, the kernels write them
  // there instead of adding into dk / dv (in one call each key row has one writer, its key block).
  void* dk_direct = nullptr;
  void* dv_direct = nullptr;
  // --deterministic (AttentionParams::deterministic): the key blocks run in rounds of a few blocks per
  // (batch, K/V head), from first_key_block; block i of a round adds dQ at dq + i * dq_slice_size (dq then
  // the slices, summed into the caller's accumulator in order after the last round).
  int first_key_block = 0;
  int64_t dq_slice_size = 0;
  // --deterministic on the wgmma backward (flash_wgmma_backward_ordered.cu): the key blocks that see a block
  // of query rows add their dQ into it one after the other, from the last key block down. Per (batch, query
  // head, block of q_blocks' query rows) a turn counter; per (batch, K/V head, block of query rows) the
  // bitmask of the key blocks whose walk reaches it (dq_writer_words words of 32) and, per word, the count
  // of set bits in the words after it.
  int* dq_turns = nullptr;
  const uint32_t* dq_writers = nullptr;
  const int* dq_writers_after = nullptr;
  int dq_writer_words = 0;
  int q_blocks = 0;
  // The wgmma kernels' TMA maps of q and d_o (tensor_map.h; their launchers set them), read from the
  // kernel's parameters (__grid_constant__).
  CUtensorMap q_map{}, do_map{};
  // The wgmma kernels' maps of dk_direct and dv_direct (set with them by with_step_maps): a block stores its dK and
  // dV through shared memory by the TMA unit.
  CUtensorMap dk_map{}, dv_map{};
  bool dk_dv_by_tma = false;
};

// Throws naming the tensor and what the kernel needs (f16 / bf16, head dims as check_flash_head_dims, dO in q's dtype,
// contiguous accumulators), pointing at sdpa.
void check_flash_backward_cuda_supported(const AttentionInputs& in, const BackwardInputs& grad, const GradViews& acc);

// dq_slices: null, or under --deterministic (AttentionParams::deterministic) the scratch of the ordered dQ
// (grown as needed): the wgmma kernel's turn counters (flash_wgmma_backward_ordered.cu), or (mma.sync, and
// wgmma's unsplit 128-column instance) at most kMaxDqSlices f32 copies of dQ. Either way the gradients are
// the same bits on every run.
void flash_backward_cuda(const FlashBackwardArgs& args, DType dtype, Tensor* dq_slices, cudaStream_t stream);

// Launches a backward instance (a __global__ taking FlashBackwardArgs, threads x smem bytes, over blocks
// of block_n keys): one launch of a block per key block, or with dq_slices launches of rounds that fit
// the GPU once, each block of a round with a dQ slice of its own, summed into dq in order after the last
// (both kernels' launch).
constexpr int kMaxDqSlices = 16;
void launch_flash_backward(const void* kernel, FlashBackwardArgs g, int block_n, int threads, size_t smem,
                           Tensor* dq_slices, cudaStream_t stream);

}  // namespace ra
