// The CPU `flash_attn2`: tiled online softmax over 64-row query and key blocks, f32 accumulation in
// the carry, parallel over (batch, head, query block), vectorised for AVX-512, AVX2 or portable
// SIMD, chosen at run time. Blocks that the causal mask, the window or segments empty are skipped.
#pragma once

#include <cstdint>

#include "attention/attention_impl.h"

namespace ra {

enum class CpuIsa : uint8_t { kGeneric, kAvx2, kAvx512 };
CpuIsa best_cpu_isa();
const char* cpu_isa_name(CpuIsa isa);

// Everything one kernel call reads and writes. Strides in elements; the last dim of q, k, v is
// contiguous. Bias / mask are indexed [b, h, local query row, global key index] (stride 0 broadcasts).
struct FlashCpuParams {
  const float* q;  // (B, T, Hq, D)
  const float* k;  // (B, S, Hkv, D)
  const float* v;  // (B, S, Hkv, Dv)
  int64_t q_stride[3], k_stride[3], v_stride[3];  // batch, row, head
  int64_t batch, q_rows, kv_rows, q_heads, kv_heads, head_dim, value_dim;
  float scale;    // softmax scale, applied to q
  float softcap;  // 0: off
  bool causal;
  int64_t window_left, window_right;      // -1: unbounded
  const int64_t* q_pos;                   // (T) key-axis position of each query row
  const int64_t* k_pos;                   // (S) global key index of each key row
  const float* bias;                      // optional
  int64_t bias_stride[4];
  const uint8_t* mask;                    // optional, nonzero = attend
  int64_t mask_stride[4];
  const int32_t* q_seg;                   // optional (B, T)
  const int32_t* k_seg;                   // optional (B, S)
  int64_t q_seg_stride[2], k_seg_stride[2];
  float dropout_prob;
  uint64_t dropout_seed;
  float* carry_num;  // (B, Hq, T, Dv)
  float* carry_den;  // (B, Hq, T)
  float* carry_max;  // (B, Hq, T)
};

inline constexpr int64_t kFlashCpuMaxHeadDim = 256;

void flash_accumulate_cpu(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                          Carry& carry, CpuIsa isa);

namespace isa_generic { void flash_forward(const FlashCpuParams& p); }
namespace isa_avx2 { void flash_forward(const FlashCpuParams& p); }
namespace isa_avx512 { void flash_forward(const FlashCpuParams& p); }

}  // namespace ra
