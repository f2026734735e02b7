// A step's tile of the additive bias staged in shared memory, for the flash kernels' bias instances: read
// per pair from global memory (the extras instances' way), the bias's loads sat on the path of every
// probability; staged by cp.async while the tensor cores work, a pair's bias is one conflict-free
// shared-memory read.
#pragma once

#include <cstdint>

#include "attention/cuda/cuda_inputs.h"
#include "attention/cuda/flash_tile.cuh"

namespace ra::flash {

// Whether nothing but positions, and dropout on keys that pair up (dropout_pairs_keyed), sits beside a call's bias
// or mask (no soft cap or segment ids; V as wide as K): what the wgmma kernels' staged-tile instances (this file's
// bias, mask_tile.cuh's mask) take beside them.
inline bool flash_positions_beside_staged_tile(const CudaAttentionArgs& a) {
  return (a.dropout_prob <= 0.0f || dropout_pairs_keyed(a)) && a.soft_cap <= 0.0f && !a.q_segment_ranges &&
         !a.q_segment_ids.data && a.head_dim == a.value_dim;
}

// Whether a call's extras are an additive bias, alone or beside dropout (no mask, soft cap or segment ids), which
// the wgmma kernels' bias instances take at the head dims they have them for.
inline bool flash_takes_bias_instance(const CudaAttentionArgs& a) {
  return a.bias.data && !a.mask.data && flash_positions_beside_staged_tile(a);
}

// The bias (broadcast to (B, Hq, T, S_total): CudaAttentionArgs::bias) of query rows m0.. and keys n0.. of
// (batch b, head h) into `tile`, f32, rows kStride floats apart (each kernel pads its rows so that its
// fragments read without bank conflicts), by kThreads threads (tid counted among them), each copying the
// same four keys of several rows: 16 bytes a copy where the four keys' positions are one run and the row's
// address allows it, else four of 4. Rows and keys past the ends read as zeros (those pairs are hidden
// anyway). Committed by the caller.
template <int kRows, int kKeys, int kStride, int kThreads>
__device__ __forceinline__ void load_bias_tile(float* tile, const CudaAttentionArgs& a, int b, int h, int m0, int n0,
                                               int tid) {
  constexpr int kQuads = kKeys / 4, kRowsPerPass = kThreads / kQuads;
  static_assert(kThreads % kQuads == 0 && kRows % kRowsPerPass == 0, "every thread copies the same rows");
  static_assert(kStride % 4 == 0, "rows of 16 bytes");
  const int quad = tid % kQuads, r0 = tid / kQuads, key0 = n0 + 4 * quad;
  const DeviceView4& bias = a.bias;
  int64_t column[4];  // the four keys' bias columns: their positions
  bool key_in[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    key_in[i] = key0 + i < a.kv_len;
    column[i] = key_in[i] ? k_position(a.pos, key0 + i) * bias.stride[3] : 0;
  }
  const bool run = key_in[3] && bias.stride[3] == 1 && column[1] == column[0] + 1 && column[2] == column[0] + 2 &&
                   column[3] == column[0] + 3;
  const float* head = static_cast<const float*>(bias.data) + b * bias.stride[0] + h * bias.stride[1];
#pragma unroll
  for (int n = 0; n < kRows / kRowsPerPass; ++n) {
    const int r = r0 + n * kRowsPerPass;
    const bool row_in = m0 + r < a.q_len;
    const float* row = head + (row_in ? int64_t(m0 + r) * bias.stride[2] : 0);
    float* to = tile + r * kStride + 4 * quad;
    if (run && reinterpret_cast<uintptr_t>(row + column[0]) % 16 == 0) {
      copy_16(to, row + column[0], row_in);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) copy_4(to + i, row + column[i], row_in && key_in[i]);
    }
  }
}

}  // namespace ra::flash
