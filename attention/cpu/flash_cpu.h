// The CPU `flash_attn2`: tiled online softmax over 64-row query and key blocks, f32 accumulation in
// the carry, parallel over (batch, head, query block), vectorised for AVX-512, AVX2 or portable
// SIMD, chosen at run time. Blocks that the causal mask, the window, segments or the boolean mask empty are skipped;
// blocks the boolean mask keeps whole run unmasked.
// The backward (flash_cpu_backward.inc) shares the tiles, the ISA variants and the skipping.
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
  int64_t batch_offset, head_offset;  // dropout's global batch and head of index 0 (AttentionParams)
  float* carry_num;  // (B, Hq, T, Dv)
  float* carry_den;  // (B, Hq, T)
  float* carry_max;  // (B, Hq, T)
};

// The backward's extra operands (attention/backward.h), contiguous f32; the carry fields unused.
struct FlashCpuBackwardParams {
  FlashCpuParams forward;
  const float* d_o;    // (B, T, Hq, Dv)
  const float* lse;    // (B, Hq, T)
  const float* delta;  // (B, Hq, T)
  float* dq;           // (B, T, Hq, D)   +=
  float* dk;           // (B, S, Hkv, D)  +=
  float* dv;           // (B, S, Hkv, Dv) +=
  float* dbias;        // optional, indexed as the bias (broadcast strides)
  int64_t dbias_stride[4];
  bool dq_thread_partials = false;  // CpuDqStrategy::kThreadPartials
};

// How the CPU flash backward forms dQ: in a second pass over query blocks, which recomputes P and dS (7
// block products instead of 5, no shared writes, no memory beyond the tiles), or in the key-block pass into
// per-thread partials summed at the end (5 products; threads x B x Hq x T x D f32 more memory).
// kAuto: the partials where they fit kDqPartialsBudgetBytes and the call has at least 16 threads^2 keys
// (bench/RESULTS.md: 1.4-1.5x faster on 2 cores at S=2048; on 16 cores 1.1-1.35x at S=4096 non-causal, even
// causal, 5-25% slower at S <= 1024). Why threads^2: zeroing and summing the partials moves threads x dQ bytes
// while the pass they save costs about S x dQ's FLOPs spread over the threads; a ring step's keys are its
// block's.
enum class CpuDqStrategy : uint8_t { kAuto, kSecondPass, kThreadPartials };
inline constexpr int64_t kDqPartialsBudgetBytes = int64_t(1) << 30;

inline constexpr int64_t kFlashCpuMaxHeadDim = 256;

void flash_accumulate_cpu(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                          Carry& carry, CpuIsa isa);
void flash_accumulate_backward_cpu(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                                   const BackwardInputs& grad, const GradViews& acc, CpuIsa isa,
                                   CpuDqStrategy dq = CpuDqStrategy::kAuto);

namespace isa_generic { void flash_forward(const FlashCpuParams& p); void flash_backward(const FlashCpuBackwardParams& g); }
namespace isa_avx2 { void flash_forward(const FlashCpuParams& p); void flash_backward(const FlashCpuBackwardParams& g); }
namespace isa_avx512 { void flash_forward(const FlashCpuParams& p); void flash_backward(const FlashCpuBackwardParams& g); }

}  // namespace ra
