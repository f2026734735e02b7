// Device pieces shared by the two CUDA flash kernels (mma.sync for sm_80+, wgmma for sm_90a): async
// copies, the key-tile schedule (visible interval, key ranges), the position mask and the online
// softmax step on an accumulator fragment, and the carry in / out. Both kernels hold S and O in the
// same per-thread fragment: for every 8-column group j, values [j][0..1] are row g = lane / 4,
// columns 8j + 2 (lane % 4) + {0, 1}, and [j][2..3] the same columns of row g + 8.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "attention/block_kind.h"
#include "attention/cuda/cuda_inputs.h"
#include "attention/cuda/pair_logit.cuh"
#include "attention/online_softmax.h"

namespace ra::flash {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, zero-filled when `valid` is false (rows past the end).
__device__ __forceinline__ void copy_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared (zero when `valid` is false), for values without 16-byte alignment.
__device__ __forceinline__ void copy_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void copy_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Rows [row0, row0 + kRows) of one (batch, head) of `src`, D 16-bit values each, into shared memory by
// kThreads threads, 16 bytes per cp.async: chunk c of row r lands at element offset(r, c) (each kernel
// has its own swizzle); rows past rows_total read as zeros. kPadded (an instance whose D is wider than
// the tensors' head dims): rows of `cols` values (a multiple of 8), columns past them read as zeros, so
// they add zero products.
template <typename T, int D, int kRows, int kThreads, bool kPadded, typename Offset>
__device__ __forceinline__ void load_rows(T* dst, const DeviceView4& src, int b, int head, int row0, int rows_total,
                                          int cols, int tid, Offset offset) {
  constexpr int kChunks = D / 8;
  static_assert(kRows * kChunks % kThreads == 0, "every thread copies the same number of chunks");
  const T* base = static_cast<const T*>(src.data) + b * src.stride[0] + head * src.stride[2];
#pragma unroll
  for (int n = 0; n < kRows * kChunks / kThreads; ++n) {  // a fixed trip count: unrolled, no guard per chunk
    const int i = tid + n * kThreads, r = i / kChunks, c = i % kChunks;
    if constexpr (kPadded) {
      const bool valid = row0 + r < rows_total && c * 8 < cols;
      copy_16(dst + offset(r, c), base + (valid ? int64_t(row0 + r) * src.stride[1] + c * 8 : 0), valid);
    } else {
      const bool valid = row0 + r < rows_total;
      copy_16(dst + offset(r, c), base + int64_t(valid ? row0 + r : 0) * src.stride[1] + c * 8, valid);
    }
  }
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// 2^x in one MUFU instruction (relative error about 2^-22; 2^-inf = 0), as FlashAttention does.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ int64_t warp_min(int64_t x) {
  for (int o = 16; o > 0; o >>= 1) x = min(x, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, x, o)));
  return x;
}
__device__ __forceinline__ int64_t warp_max(int64_t x) {
  for (int o = 16; o > 0; o >>= 1) x = max(x, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, x, o)));
  return x;
}

// A query's / key's position: computed where the positions are one run (DevicePositions::q_run, k_run: no wait
// for a read on the path to a block's first tile), else read. Positions::kRead: always read, as the mma.sync
// kernels do (at their register limit, the computed form cost their instances up to 56 bytes more stack in spills).
enum class Positions { kComputedWhereRun, kRead };
template <Positions kFrom = Positions::kComputedWhereRun>
__device__ __forceinline__ int64_t q_position(const DevicePositions& p, int64_t row) {
  return kFrom == Positions::kComputedWhereRun && p.q_run != DevicePositions::kNotARun ? p.q_run + row : p.q[row];
}
template <Positions kFrom = Positions::kComputedWhereRun>
__device__ __forceinline__ int64_t k_position(const DevicePositions& p, int64_t row) {
  return kFrom == Positions::kComputedWhereRun && p.k_run != DevicePositions::kNotARun ? p.k_run + row : p.k[row];
}

// The range of key positions of tile `t` (kBlockN keys): its first and last entry when keys are
// sorted, else a scan by the warp (every warp computes the same, so no synchronisation is needed).
template <int kBlockN, Positions kFrom = Positions::kComputedWhereRun>
__device__ __forceinline__ void tile_key_range(const CudaAttentionArgs& a, int t, int lane, int64_t& lo, int64_t& hi) {
  const int n0 = t * kBlockN;
  if (a.pos.keys_sorted) {
    lo = k_position<kFrom>(a.pos, n0);
    hi = k_position<kFrom>(a.pos, min(n0 + kBlockN, a.kv_len) - 1);
    return;
  }
  lo = INT64_MAX;
  hi = INT64_MIN;
  for (int j = lane; j < kBlockN; j += 32)
    if (n0 + j < a.kv_len) {
      const int64_t p = k_position<kFrom>(a.pos, n0 + j);
      lo = min(lo, p);
      hi = max(hi, p);
    }
  lo = warp_min(lo);
  hi = warp_max(hi);
}

// The tiles [first, last] within [first, last] as given that can hold a key visible to a query in
// [q_lo, q_hi]. With sorted keys the visible tiles are one interval (the mask is monotone in the key
// position): two binary searches over the given tiles.
template <int kBlockN, Positions kFrom = Positions::kComputedWhereRun>
__device__ void narrow_visible_tiles(const CudaAttentionArgs& a, int64_t q_lo, int64_t q_hi, int& first, int& last) {
  if (!a.pos.keys_sorted || first > last) return;
  if (a.window_left >= 0) {  // first tile whose last key >= q_lo - left
    const int64_t bound = q_lo - a.window_left;
    int lo = first, hi = last + 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (k_position<kFrom>(a.pos, min((mid + 1) * kBlockN, a.kv_len) - 1) >= bound) hi = mid;
      else lo = mid + 1;
    }
    first = lo;
  }
  int64_t limit = INT64_MAX;
  if (a.causal) limit = q_hi;
  if (a.window_right >= 0) limit = min(limit, q_hi + a.window_right);
  if (limit != INT64_MAX) {  // last tile whose first key <= limit
    int lo = first - 1, hi = last;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (k_position<kFrom>(a.pos, mid * kBlockN) <= limit) lo = mid;
      else hi = mid - 1;
    }
    last = lo;
  }
}

// The same over all the key tiles.
template <int kBlockN, Positions kFrom = Positions::kComputedWhereRun>
__device__ void visible_tiles(const CudaAttentionArgs& a, int64_t q_lo, int64_t q_hi, int& first, int& last) {
  first = 0;
  last = (a.kv_len + kBlockN - 1) / kBlockN - 1;
  narrow_visible_tiles<kBlockN, kFrom>(a, q_lo, q_hi, first, last);
}

// The segment id of row `row` of batch b (ids is q_segment_ids or kv_segment_ids).
__device__ __forceinline__ int32_t segment_id(const DeviceView4& ids, int b, int row) {
  return static_cast<const int32_t*>(ids.data)[b * ids.stride[0] + row * ids.stride[1]];
}

// The range of segment ids over rows [row0, row0 + rows) of batch b, from the 64-row chunks that hold
// them (segment_ranges.h; a chunk's range bounds any of its rows'); empty (lo > hi) past the end. On the
// chunks' windows the same gives the rows [x, y) of the other side that any of these rows can meet.
__device__ __forceinline__ int2 segment_range(const int2* ranges, int len, int b, int row0, int rows) {
  const int chunks = (len + 63) / 64, end = min((row0 + rows - 1) / 64, chunks - 1);
  int2 r = make_int2(INT_MAX, INT_MIN);
  for (int c = row0 / 64; c <= end; ++c) {
    const int2 x = ranges[int64_t(b) * chunks + c];
    r.x = min(r.x, x.x), r.y = max(r.y, x.y);
  }
  return r;
}

// A pair's kind by positions narrowed by segments, from the segment ranges of its queries and keys
// (kind unchanged without segment ids).
__device__ __forceinline__ BlockKind with_segments(const CudaAttentionArgs& a, BlockKind kind, int2 q_seg, int2 k_seg) {
  if (!a.q_segment_ranges || kind == BlockKind::kSkip) return kind;
  return both_kinds(kind, classify_segments(q_seg.x, q_seg.y, k_seg.x, k_seg.y));
}

// The first tile of kBlockN keys in [from, last] that shares a segment with queries whose ids span
// q_seg, 32 tiles per round by the warp (every warp finds the same); last + 1 if none. Without
// segment ids (or in an instance without kSegments), `from`.
template <int kBlockN, bool kSegments>
__device__ __forceinline__ int next_segment_tile(const CudaAttentionArgs& a, int b, int2 q_seg, int from, int last,
                                                 int lane) {
  if constexpr (!kSegments) return from;
  if (!a.kv_segment_ranges) return from;
  for (int t0 = from; t0 <= last; t0 += 32) {
    const int t = t0 + lane;
    bool meets = false;
    if (t <= last) {
      const int2 k = segment_range(a.kv_segment_ranges, a.kv_len, b, t * kBlockN, kBlockN);
      meets = k.y >= q_seg.x && k.x <= q_seg.y;
    }
    const unsigned found = __ballot_sync(0xffffffffu, meets);
    if (found) return t0 + __ffs(found) - 1;
  }
  return max(from, last + 1);
}

// The key tiles [first, last] that the kBlockM queries from m0 (positions [q_lo, q_hi]) can see. A kSegments
// instance with segment ids looks only among the tiles of the block's documents' keys (all tiles where the
// ids are not sorted), so that the position search spans only them.
template <int kBlockN, int kBlockM, bool kSegments, Positions kFrom = Positions::kComputedWhereRun>
__device__ __forceinline__ void block_visible_tiles(const CudaAttentionArgs& a, int b, int m0, int64_t q_lo, int64_t q_hi,
                                                    int& first, int& last) {
  if (kSegments && a.q_key_windows) {
    const int2 keys = segment_range(a.q_key_windows, a.q_len, b, m0, kBlockM);
    first = keys.x / kBlockN;
    last = keys.y > 0 ? (keys.y - 1) / kBlockN : -1;
    narrow_visible_tiles<kBlockN, kFrom>(a, q_lo, q_hi, first, last);
  } else {
    visible_tiles<kBlockN, kFrom>(a, q_lo, q_hi, first, last);
  }
}

// What an instance may know of a tile's keys before masking it, so that masking reads neither key's
// position nor its id where it need not: positions consecutive from first_pos (sorted keys that fill
// their range: every layout's tiles but those across a chunk's edge), and (kSegments instances) one
// segment id for the whole tile.
struct TileKeys {
  bool consecutive = false;
  int64_t first_pos = 0;
  bool one_segment = false;
  int32_t segment = 0;
};

// The columns [x, y) of a tile of `width` keys at consecutive positions from first_pos that query
// position qpos sees (causal, window): position_visible as bounds, so that a masked tile compares
// 32-bit columns rather than 64-bit positions read per pair.
__device__ __forceinline__ int2 visible_columns(const CudaAttentionArgs& a, int64_t qpos, int64_t first_pos, int width) {
  int64_t lo = 0, hi = width;
  if (a.window_left >= 0) lo = max(lo, qpos - a.window_left - first_pos);
  if (a.causal) hi = min(hi, qpos - first_pos + 1);
  if (a.window_right >= 0) hi = min(hi, qpos + a.window_right - first_pos + 1);
  return make_int2(int(lo < width ? lo : width), int(hi > 0 ? hi : 0));
}

// The backward's twin: the columns [x, y) of a step of `width` queries at consecutive positions from
// first_pos that see key position kpos.
__device__ __forceinline__ int2 seeing_columns(const CudaAttentionArgs& a, int64_t kpos, int64_t first_pos, int width) {
  int64_t lo = 0, hi = width;
  if (a.causal) lo = max(lo, kpos - first_pos);
  if (a.window_right >= 0) lo = max(lo, kpos - a.window_right - first_pos);
  if (a.window_left >= 0) hi = min(hi, kpos + a.window_left - first_pos + 1);
  return make_int2(int(lo < width ? lo : width), int(hi > 0 ? hi : 0));
}

// What the mma.sync kernels know of the tile of keys from n0: consecutive where the keys are one run (k_run), else
// nothing (their positions are read).
__device__ __forceinline__ TileKeys run_tile_keys(const CudaAttentionArgs& a, int n0) {
  const bool run = a.pos.k_run != DevicePositions::kNotARun;
  return TileKeys{run, run ? a.pos.k_run + n0 : 0};
}

// A key's position: from the tile's first where they are consecutive, else read.
__device__ __forceinline__ int64_t key_position(const CudaAttentionArgs& a, const TileKeys* keys, int n0, int col) {
  if (keys == nullptr) return a.pos.k[col];  // the mma.sync kernels (q_position's note)
  return keys->consecutive ? keys->first_pos + (col - n0) : k_position(a.pos, col);
}

// Positions and segment ids (causal, window, the ends of the sequences, documents; ids in kSegments
// instances only) on one 16-row fragment of NT column groups starting at key n0; `row0` is this
// thread's first row. Visible scores become log2 units, hidden ones -inf. kColumnLimits (the wgmma
// forward): a tile of consecutive keys compares each pair's column with its row's visible columns, found
// once per row, instead of reading and comparing positions per pair (4x the cost of the tile's products,
// measured); where the tile holds one document, a row of another sees none of it. The mma.sync kernel
// keeps the per-pair form, whose register use it is tuned to (the column form made it spill more).
template <bool kSegments, int NT, bool kColumnLimits = false>
__device__ __forceinline__ void mask_positions(const CudaAttentionArgs& a, float (&s)[NT][4], int b, int n0, int lane,
                                               int row0, float scale_log2, const TileKeys* keys = nullptr) {
  // Positions computed where they run in the wgmma forward (kColumnLimits), read in the mma.sync kernel.
  constexpr Positions kFrom = kColumnLimits ? Positions::kComputedWhereRun : Positions::kRead;
  const int64_t qpos0 = row0 < a.q_len ? q_position<kFrom>(a.pos, row0) : 0,
                qpos1 = row0 + 8 < a.q_len ? q_position<kFrom>(a.pos, row0 + 8) : 0;
  const bool segments = kSegments && a.q_segment_ids.data != nullptr;
  const int32_t qseg0 = segments && row0 < a.q_len ? segment_id(a.q_segment_ids, b, row0) : 0;
  const int32_t qseg1 = segments && row0 + 8 < a.q_len ? segment_id(a.q_segment_ids, b, row0 + 8) : 0;
  if (kColumnLimits && keys->consecutive) {
    const int width = min(NT * 8, a.kv_len - n0);
    int2 cols[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      cols[i] = row0 + 8 * i < a.q_len && (!segments || !keys->one_segment || keys->segment == (i ? qseg1 : qseg0))
                    ? visible_columns(a, i ? qpos1 : qpos0, keys->first_pos, width)
                    : make_int2(0, 0);
    const bool ids_per_pair = segments && !keys->one_segment;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = j * 8 + (lane % 4) * 2 + (e & 1);
        bool visible = c >= cols[e / 2].x && c < cols[e / 2].y;
        if (ids_per_pair && visible) visible = segment_id(a.kv_segment_ids, b, n0 + c) == (e < 2 ? qseg0 : qseg1);
        s[j][e] = visible ? s[j][e] * scale_log2 : -INFINITY;
      }
    return;
  }
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = n0 + j * 8 + (lane % 4) * 2 + (e & 1);
      const int row = row0 + (e < 2 ? 0 : 8);
      const bool consecutive = kSegments && keys != nullptr && keys->consecutive;
      bool visible =
          col < a.kv_len && row < a.q_len &&
          position_visible(e < 2 ? qpos0 : qpos1,
                           consecutive ? keys->first_pos + (col - n0) : k_position<kFrom>(a.pos, col), a.causal,
                           a.window_left, a.window_right);
      if (segments && visible)
        visible = (keys != nullptr && keys->one_segment ? keys->segment : segment_id(a.kv_segment_ids, b, col)) ==
                  (e < 2 ? qseg0 : qseg1);
      s[j][e] = visible ? s[j][e] * scale_log2 : -INFINITY;
    }
}

// tanh for the soft cap in one MUFU operation, in two forms: tanhf takes two (EX2 and RCP), which beside the
// softmax's EX2 bound the capped kernels. Which form a pass uses is measured (bench/RESULTS.md, "The wgmma
// forward at head_dim 192; the soft cap's tanh in eleven instructions").
// soft_cap_tanh, the backward's: 1 - 2 / (e^2x + 1), the reciprocal by three Newton steps on the FMA pipe from
// an integer first guess (relative error 1/8, then 2e-2, 2e-4, 6e-8); absolute error about 3.4e-7. |x| > 9 is
// +-1 in f32 (and keeps the sum finite); NaN stays NaN. Its values live briefly: the short form below held more
// registers and cost the wgmma backward (at its register limit) 7%.
__device__ __forceinline__ float soft_cap_tanh(float x) {
  x = x > 9.0f ? 9.0f : x < -9.0f ? -9.0f : x;
  const float d = fast_exp2(x * (2.0f * kLog2e)) + 1.0f;
  float r = __int_as_float(0x7EF311C3 - __float_as_int(d));
#pragma unroll
  for (int step = 0; step < 3; ++step) r *= fmaf(-d, r, 2.0f);
  return fmaf(-2.0f, r, 1.0f);
}

// soft_cap_tanh_short, the forwards': tanh(k x) in eleven instructions with the cap's multiplies (seventeen
// above), for softmax steps bound by their instruction count (wgmma at head_dim 256 +7%, mma.sync +3%, level at
// 128). tanh |y| = 2 / (1 + e) - 1 = 1 / h - 1 with e = 2^(-2 |y| log2 e) in (0, 1] (never overflows: no
// clamp; NaN stays NaN) and h = (1 + e) / 2 in [1/2, 1]; 1 / h from a quadratic first guess (minimax,
// relative error 1.0e-2) and two Newton steps (1e-4, 1e-8), the last fused with the - 1; absolute error about
// 3.6e-7. `exponent_scale` is kTanhExponentScale k: k's multiply folded into the exponent's.
constexpr float kTanhExponentScale = -2.0f * kLog2e;
__device__ __forceinline__ float soft_cap_tanh_short(float x, float exponent_scale) {
  const float h = fmaf(fast_exp2(fabsf(x) * exponent_scale), 0.5f, 0.5f);
  float r = fmaf(fmaf(2.5858586f, h, -5.818182f), h, 4.242424f);
  r *= fmaf(-h, r, 2.0f);
  return copysignf(fmaf(r, fmaf(-h, r, 2.0f), -1.0f), x);
}

// The soft cap of raw scores s: cap tanh(s scale / cap), in log2 units (as the softmax takes them); kShort: by
// soft_cap_tanh_short (the forwards).
template <bool kShort, int NT>
__device__ __forceinline__ void soft_cap_scores(float (&s)[NT][4], float scale_over_cap, float cap_log2) {
  [[maybe_unused]] const float exponent_scale = scale_over_cap * kTanhExponentScale;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (kShort) s[j][e] = cap_log2 * soft_cap_tanh_short(s[j][e], exponent_scale);
      else s[j][e] = cap_log2 * soft_cap_tanh(s[j][e] * scale_over_cap);
    }
}

// The bias and the boolean mask tensors on a fragment of logits in log2 units from key n0 (the extras
// instances, after mask_positions): a pair the mask hides becomes -inf, the others gain the bias. Hidden
// pairs (-inf: positions, segments, past the ends) stay hidden and read nothing.
template <int NT>
__device__ __forceinline__ void add_bias_mask(const CudaAttentionArgs& a, float (&s)[NT][4], int b, int h, int n0,
                                              int lane, int row0, const TileKeys* keys) {
  if (!a.bias.data && !a.mask.data) return;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (s[j][e] == -INFINITY) continue;
      const int col = n0 + j * 8 + (lane % 4) * 2 + (e & 1), row = row0 + (e < 2 ? 0 : 8);
      float bias;
      s[j][e] = pair_bias_mask(a, b, h, row, key_position(a, keys, n0, col), bias) ? fmaf(bias, kLog2e, s[j][e]) : -INFINITY;
    }
}

// Whether the keys pair up as dropout's decisions do (dropout_key_word): each 16 key rows from a multiple of 16 (an
// MMA fragment's rows, or its column pairs 8 apart) are positions k and k + 8 with k's bit 3 clear, so that one
// finalizer decides two of a thread's pairs. A run from a multiple of 16 does (a single call's keys); otherwise the
// caller's answer found once (a ring's blocks, RingSchedule::keys_pair_up: contiguous and zigzag chunks of a multiple
// of 16 do, striped positions do not), else a scan of the host's copy of the positions.
inline bool dropout_keys_pair_up(const DevicePositions& pos, int64_t kv_len) {
  if (pos.k_run != DevicePositions::kNotARun) return (pos.k_run & 15) == 0;
  if (pos.key_pairing != DevicePositions::KeyPairing::kUnknown) return pos.key_pairing == DevicePositions::KeyPairing::kPairs;
  return pos.k_host != nullptr && ra::dropout_keys_pair_up(std::span<const int64_t>(pos.k_host, size_t(kv_len)));
}

// Dropout's key pairing found once a call (dropout_keys_pair_up, a scan of the keys' host copy where the caller did not
// say), which the instance choice and the extras instances' decisions (dropout_pairs_keyed) read.
inline void find_dropout_key_pairing(CudaAttentionArgs& a) {
  using enum DevicePositions::KeyPairing;
  if (a.dropout_prob > 0.0f) a.pos.key_pairing = dropout_keys_pair_up(a.pos, a.kv_len) ? kPairs : kApart;
}

// Whether the extras instances take dropout's decisions as the dropout instances do, a finalizer two pairs (drop_keyed,
// dropout_pair_weight): keys that pair up (find_dropout_key_pairing) and a p whose threshold the pair form has room for.
__host__ __device__ inline bool dropout_pairs_keyed(const CudaAttentionArgs& a) {
  return a.dropout_prob > 0.0f && a.pos.key_pairing == DevicePositions::KeyPairing::kPairs &&
         dropout_threshold(a.dropout_prob) < 65536u;
}

// Whether a call's extras are dropout beside positions and segment ids (no bias, mask or soft cap; V as wide as K)
// on keys that pair up, which the dropout instances take: the wgmma kernels' at the head dims they have them for, the
// mma.sync kernels' at every head dim (segment ids through their ranges, as the positions' instances take them). Keys
// that do not pair up, and a p that drops every pair (dropout_threshold_high has no room for its threshold), take the
// extras.
inline bool flash_takes_dropout_beside_positions(const CudaAttentionArgs& a) {
  return a.dropout_prob > 0.0f && !a.bias.data && !a.mask.data && a.soft_cap <= 0.0f &&
         (!a.q_segment_ids.data || a.q_segment_ranges) && a.head_dim == a.value_dim && dropout_pairs_keyed(a);
}

// Query row `row`'s dropout key (dropout_row_key) folded (mix32_fold), formed once per row by the dropout instances
// (the wgmma and mma.sync kernels', forward and backward); a row past the queries' end (never stored) takes position 0.
__device__ __forceinline__ uint32_t dropout_folded_row_key_at(const CudaAttentionArgs& a, int b, int h, int64_t row) {
  return dropout_rows(a, b, h).folded_row_key(row < a.q_len ? q_position(a.pos, row) : 0);
}

// The decisions of one finalizer's two pairs (dropout_pair_bits): its low key's P and its high key's (8 further) P
// become 0 where dropped, else stay, branch-free.
__device__ __forceinline__ void drop_pair(uint32_t row_folded, uint32_t word_folded, uint32_t threshold_high,
                                          float& low, float& high) {
  const uint32_t bits = dropout_pair_bits(row_folded, word_folded);
  low = dropout_pair_low_drops(bits, threshold_high) ? 0.0f : low;
  high = dropout_pair_high_drops(bits, threshold_high) ? 0.0f : high;
}

// Dropout on a fragment of probabilities from key n0 with its two rows' keys formed and folded once
// (dropout_folded_row_key_at; the dropout instances of the forwards, whose keys pair up: dropout_keys_pair_up): a
// dropped pair's P becomes 0, a kept one's stays P; the kernel scales O by 1 / (1 - p) once at its end. Columns
// 8j + c and 8(j + 1) + c (j even) are keys 8 apart, whose decisions are one finalizer's halves. Columns past the
// keys' end (P = 0) read no position.
template <int NT>
__device__ __forceinline__ void drop_keyed(const CudaAttentionArgs& a, float (&s)[NT][4], const uint32_t (&row_folded)[2],
                                           int n0, int lane, const TileKeys* keys) {
  static_assert(NT % 2 == 0, "keys 8 apart pair up within the tile");
  const uint32_t threshold_high = dropout_threshold_high(dropout_threshold(a.dropout_prob));
  const int64_t first = keys->first_pos;
  if (keys->consecutive && (first & 15) == 0 && (first >> 32) == ((first + NT * 8 - 1) >> 32)) {
    // Consecutive keys from a multiple of 16 under one high half (a single call's, a chunk's): a column's word is
    // the first column's product plus the factor times its offset (dropout_position_word), the high half's term
    // folded into the rows' keys (SASS, wgmma at D = 64: 405 instructions for a thread's 64 pairs of a tile, against
    // 735 forming each word from its position).
    const uint32_t high = mix32_fold(dropout_position_high_term(first));
    const uint32_t rows[2] = {row_folded[0] ^ high, row_folded[1] ^ high};
    const uint32_t low0 = (uint32_t(uint64_t(first)) + (lane % 4) * 2) * kDropoutKeyOdd;
#pragma unroll
    for (int j = 0; j < NT; j += 2)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint32_t word = mix32_fold(low0 + uint32_t(j * 8 + c) * kDropoutKeyOdd);
#pragma unroll
        for (int i = 0; i < 2; ++i) drop_pair(rows[i], word, threshold_high, s[j][2 * i + c], s[j + 1][2 * i + c]);
      }
    return;
  }
#pragma unroll
  for (int j = 0; j < NT; j += 2)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = n0 + j * 8 + (lane % 4) * 2 + c;
      const uint32_t word =
          mix32_fold(dropout_key_word(keys->consecutive || col < a.kv_len ? key_position(a, keys, n0, col) : 0));
#pragma unroll
      for (int i = 0; i < 2; ++i) drop_pair(row_folded[i], word, threshold_high, s[j][2 * i + c], s[j + 1][2 * i + c]);
    }
}

// The backward's dropout weight on fragment element e of a transposed tile (S^T: key rows r and r + 8, query columns):
// the forward's decision (drop_keyed), 0 where dropped, else keep_scale. Elements 0 and 1 (key r) form their query
// column's finalizer into bits[e]; 2 and 3 (key r + 8) read it again, so call them in order.
__device__ __forceinline__ float dropout_pair_weight(uint32_t (&bits)[2], int e, uint32_t row_folded,
                                                     uint32_t word_folded, uint32_t threshold_high, float keep_scale) {
  if (e < 2) bits[e] = dropout_pair_bits(row_folded, word_folded);
  const bool dropped = e < 2 ? dropout_pair_low_drops(bits[e & 1], threshold_high)
                             : dropout_pair_high_drops(bits[e & 1], threshold_high);
  return dropped ? 0.0f : keep_scale;
}

// Every element of an accumulator fragment times `by` (the dropout instances' O: by 1 - p as a carry's O loads, by
// 1 / (1 - p) at the end).
template <int N>
__device__ __forceinline__ void scale_fragment(float (&o)[N][4], float by) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] *= by;
}

// Dropout beside a bias, mask or soft cap (the extras instances) on a fragment of probabilities from key n0, the
// softmax's denominator already having them all: a dropped pair's P becomes 0, a kept one's P / (1 - p). Keys that
// pair up (dropout_pairs_keyed) take drop_keyed's one finalizer for two pairs; others one for each pair, each row's key
// formed once and hidden pairs (P = 0) not hashed. The mma.sync kernels pass no TileKeys (q_position's note).
template <int NT>
__device__ __forceinline__ void drop_probabilities(const CudaAttentionArgs& a, float (&s)[NT][4], int b, int h, int n0,
                                                   int lane, int row0, const TileKeys* keys) {
  const DropoutRows drop = dropout_rows(a, b, h);
  int64_t qpos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + i * 8;
    qpos[i] = row >= a.q_len ? 0 : keys != nullptr ? q_position(a.pos, row) : a.pos.q[row];
  }
  if (dropout_pairs_keyed(a)) {
    const uint32_t row_folded[2] = {drop.folded_row_key(qpos[0]), drop.folded_row_key(qpos[1])};
    const TileKeys run_keys = run_tile_keys(a, n0);
    drop_keyed(a, s, row_folded, n0, lane, keys != nullptr ? keys : &run_keys);
    scale_fragment(s, drop.keep_scale);
    return;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t row_key = drop.row_key(qpos[i]);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 2 * i; e < 2 * i + 2; ++e)
        if (s[j][e] > 0.0f)
          s[j][e] *= drop.weight(row_key, key_position(a, keys, n0, n0 + j * 8 + (lane % 4) * 2 + (e & 1)));
  }
}

// The softmax half of an online-softmax step on a 16-row fragment: S (scores times `sc`, in log2
// units) -> P in place, the running max and this lane's share of the denominator updated, and the
// factor `alpha` by which O must be rescaled. A row with nothing visible yet keeps max -inf:
// exponentiating against 0 instead gives P = 0, never NaN.
template <int NT>
__device__ __forceinline__ void softmax_probabilities(float (&s)[NT][4], float (&m_row)[2], float (&l_row)[2], float sc,
                                                      float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < NT; ++j) tile_max = fmaxf(tile_max, fmaxf(s[j][2 * i], s[j][2 * i + 1]));
    tile_max = quad_max(tile_max) * sc;
    const float m_new = fmaxf(m_row[i], tile_max);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    alpha[i] = fast_exp2(m_row[i] - m_use);
    m_row[i] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 2 * i; e < 2 * i + 2; ++e) {
        const float p = fast_exp2(fmaf(s[j][e], sc, -m_use));
        sum += p;
        s[j][e] = p;
      }
    l_row[i] = l_row[i] * alpha[i] + sum;
  }
}

template <int DT>
__device__ __forceinline__ void rescale_rows(float (&o)[DT][4], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    o[j][0] *= alpha[0];
    o[j][1] *= alpha[0];
    o[j][2] *= alpha[1];
    o[j][3] *= alpha[1];
  }
}

// A whole step: probabilities, then O rescaled at once (the mma.sync kernel; the wgmma kernel
// rescales after the previous tile's P V has landed).
template <int NT, int DT>
__device__ __forceinline__ void softmax_step(float (&s)[NT][4], float (&o)[DT][4], float (&m_row)[2], float (&l_row)[2],
                                             float sc) {
  float alpha[2];
  softmax_probabilities(s, m_row, l_row, sc, alpha);
  rescale_rows(o, alpha);
}

// P as 16-bit A operands: keys 16 kc .. 16 kc + 15 of the fragment are mma's / wgmma's A registers
// {row g, keys 2t..}, {row g + 8, keys 2t..}, {row g, keys 2t + 8..}, {row g + 8, keys 2t + 8..}.
template <typename T, int NT>
__device__ __forceinline__ void pack_probabilities(const float (&s)[NT][4], int kc, uint32_t (&p)[4]) {
  p[0] = pack2<T>(s[2 * kc][0], s[2 * kc][1]);
  p[1] = pack2<T>(s[2 * kc][2], s[2 * kc][3]);
  p[2] = pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
  p[3] = pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
}

// The carry of this thread's two rows (row0, row0 + 8) into the fragment: O from the numerator, the
// max in log2 units, the denominator on the quad's first lane only (the partial sums meet at the end).
// kPadded: the carry's rows hold value_dim < DT * 8 columns (the rest of the fragment reads 0; the carry
// helpers below likewise store only those).
template <bool kPadded, int DT>
__device__ __forceinline__ void load_carry(const CudaAttentionArgs& a, int64_t carry_row0, int row0, int lane,
                                           float (&o)[DT][4], float (&m_row)[2], float (&l_row)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + i * 8;
    const bool valid = row < a.q_len;
    const float m = valid ? a.max[carry_row0 + row] : -INFINITY;
    m_row[i] = m == -INFINITY ? -INFINITY : m * kLog2e;
    l_row[i] = valid && lane % 4 == 0 ? a.denominator[carry_row0 + row] : 0.0f;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      const int col = j * 8 + (lane % 4) * 2;
      const int64_t width = kPadded ? a.value_dim : DT * 8;
      const float2 v = valid && (!kPadded || j * 8 < a.value_dim)
                           ? *reinterpret_cast<const float2*>(a.numerator + (carry_row0 + row) * width + col)
                           : float2{0, 0};
      o[j][2 * i] = v.x;
      o[j][2 * i + 1] = v.y;
    }
  }
}

template <bool kPadded, int DT>
__device__ __forceinline__ void store_carry(const CudaAttentionArgs& a, int64_t carry_row0, int row0, int lane,
                                            const float (&o)[DT][4], const float (&m_row)[2], const float (&l_row)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + i * 8;
    const float l = quad_sum(l_row[i]);
    if (row >= a.q_len) continue;
    if (lane % 4 == 0) {
      a.denominator[carry_row0 + row] = l;
      a.max[carry_row0 + row] = m_row[i] == -INFINITY ? -INFINITY : m_row[i] / kLog2e;
    }
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      const int col = j * 8 + (lane % 4) * 2;
      const int64_t width = kPadded ? a.value_dim : DT * 8;
      if (!kPadded || j * 8 < a.value_dim)
        *reinterpret_cast<float2*>(a.numerator + (carry_row0 + row) * width + col) =
            float2{o[j][2 * i], o[j][2 * i + 1]};
    }
  }
}

// A single call's end (CudaAttentionArgs::o_direct): this thread's two rows (row0, row0 + 8 of batch b,
// head h) normalised with the sink, as finalize does a carry, and written as O and LSE.
template <typename T, bool kPadded, int DT>
__device__ __forceinline__ void store_output(const CudaAttentionArgs& a, int b, int h, int row0, int lane,
                                             const float (&o)[DT][4], const float (&m_row)[2], const float (&l_row)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + i * 8;
    const float l = quad_sum(l_row[i]);
    if (row >= a.q_len) continue;
    const float m = m_row[i] == -INFINITY ? -INFINITY : m_row[i] / kLog2e;
    const Normalized<float> done = softmax_normalize(SoftmaxState<float>{m, l}, a.sinks != nullptr,
                                                     a.sinks != nullptr ? a.sinks[h * a.sink_stride] : 0.0f);
    if (lane % 4 == 0) a.lse_direct[(int64_t(b) * a.q_heads + h) * a.q_len + row] = done.lse;
    const int64_t width = kPadded ? a.value_dim : DT * 8;
    const int64_t at = ((int64_t(b) * a.q_len + row) * a.q_heads + h) * width + (lane % 4) * 2;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      if (kPadded && j * 8 >= a.value_dim) break;
      const float x = o[j][2 * i] * done.scale, y = o[j][2 * i + 1] * done.scale;
      if (a.o_f32) *reinterpret_cast<float2*>(static_cast<float*>(a.o_direct) + at + j * 8) = float2{x, y};
      else *reinterpret_cast<uint32_t*>(static_cast<T*>(a.o_direct) + at + j * 8) = pack2<T>(x, y);
    }
  }
}

// Folds what this kernel computed for its two rows (O, max in log2 units, partial denominators, all
// over the tiles it saw, starting from an empty carry) into the carry in memory and stores the sum:
// read at the end rather than the start, the carry is the only input a kernel launched behind the
// previous block's (programmatic dependent launch) must wait for, so it waits after all its tiles.
template <bool kPadded, int DT>
__device__ __forceinline__ void merge_into_carry(const CudaAttentionArgs& a, int64_t carry_row0, int row0, int lane,
                                                 float (&o)[DT][4], float (&m_row)[2], float (&l_row)[2]) {
  float carry_o[DT][4], carry_m[2], carry_l[2];
  load_carry<kPadded>(a, carry_row0, row0, lane, carry_o, carry_m, carry_l);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m_row[i], carry_m[i]);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // both empty: every term below is 0
    const float mine = fast_exp2(m_row[i] - m_use), theirs = fast_exp2(carry_m[i] - m_use);
    l_row[i] = l_row[i] * mine + carry_l[i] * theirs;
    m_row[i] = m_new;
#pragma unroll
    for (int j = 0; j < DT; ++j)
#pragma unroll
      for (int e = 2 * i; e < 2 * i + 2; ++e) o[j][e] = o[j][e] * mine + carry_o[j][e] * theirs;
  }
  store_carry<kPadded>(a, carry_row0, row0, lane, o, m_row, l_row);
}

// The query-position range [lo, hi] of this warp's rows (lo > hi when none is below q_len).
template <int kRowsPerWarp, Positions kFrom = Positions::kComputedWhereRun>
__device__ __forceinline__ void warp_query_range(const CudaAttentionArgs& a, int warp_row0, int lane, int64_t& lo,
                                                 int64_t& hi) {
  lo = INT64_MAX;
  hi = INT64_MIN;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r += 8) {
    const int row = warp_row0 + r + lane / 4;
    if (row < a.q_len) lo = min(lo, q_position<kFrom>(a.pos, row)), hi = max(hi, q_position<kFrom>(a.pos, row));
  }
  lo = warp_min(lo);
  hi = warp_max(hi);
}

}  // namespace ra::flash
