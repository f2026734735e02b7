// Device pieces shared by the two CUDA flash backward kernels (mma.sync for every option, wgmma on
// sm_90a for positions only): the walk over the query blocks that can see a key block, and the
// gradients' way out of the register fragments (dQ by atomics, dK / dV added into the accumulators of
// keys the block owns). Fragments are the mma / wgmma accumulator layout of flash_tile.cuh.
#pragma once

#include <climits>

#include "attention/block_kind.h"
#include "attention/cuda/flash_backward_cuda.h"
#include "attention/cuda/flash_tile.cuh"
#include "attention/cuda/segment_ranges.h"

namespace ra::flash {

// The position range [lo, hi] of `count` rows from row0 (every lane of the warp gets the same).
__device__ __forceinline__ void position_range(const int64_t* positions, int row0, int count, int rows_total, int lane,
                                               int64_t& lo, int64_t& hi) {
  lo = INT64_MAX;
  hi = INT64_MIN;
  for (int r = lane; r < count; r += 32)
    if (row0 + r < rows_total) lo = min(lo, positions[row0 + r]), hi = max(hi, positions[row0 + r]);
  lo = warp_min(lo);
  hi = warp_max(hi);
}

// The kind of the block of kBlockM query rows from m0 against keys [k_lo, k_hi] whose segment ids span
// k_seg, scanned by one lane alone (kSkip past the end). kSegments: the kernel instance that reads
// segment ids (the others compile without a trace of them: the backward kernels sit at their register
// limit, where any more live values spill).
template <int kBlockM, bool kSegments, Positions kFrom = Positions::kComputedWhereRun>
__device__ __forceinline__ BlockKind lane_block_kind(const CudaAttentionArgs& a, int b, int2 k_seg, int m0,
                                                     int64_t k_lo, int64_t k_hi) {
  if (m0 >= a.q_len) return BlockKind::kSkip;
  const int end = min(m0 + kBlockM, a.q_len);
  BlockKind kind;
  if (a.pos.queries_sorted) {
    kind = classify_block(q_position<kFrom>(a.pos, m0), q_position<kFrom>(a.pos, end - 1), k_lo, k_hi, a.causal,
                          a.window_left, a.window_right);
  } else {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
#pragma unroll 8
    for (int r = m0; r < end; ++r) lo = min(lo, q_position<kFrom>(a.pos, r)), hi = max(hi, q_position<kFrom>(a.pos, r));
    kind = classify_block(lo, hi, k_lo, k_hi, a.causal, a.window_left, a.window_right);
  }
  if (!kSegments || !a.q_segment_ranges) return kind;
  return with_segments(a, kind, segment_range(a.q_segment_ranges, a.q_len, b, m0, kBlockM), k_seg);
}

// The query rows [first, end) that can share a segment with the kBlockN keys from n0 (sorted segment
// ids: their documents' rows, segment_ranges.h); all rows otherwise and without kSegments. one_document:
// sorted ids and the keys all of one document, whose rows are then every row of the window's chunks
// but its first and last (the ids never decrease: the first chunk's largest id and the last's smallest
// reach the keys' one, so every chunk between holds it alone).
struct QueryWindow {
  int first = 0, end = INT_MAX;
  bool one_document = false;
};
template <int kBlockN, bool kSegments>
__device__ __forceinline__ QueryWindow query_window(const CudaAttentionArgs& a, int b, int n0) {
  QueryWindow w;
  if (kSegments && a.kv_query_windows) {
    const int2 rows = segment_range(a.kv_query_windows, a.kv_len, b, n0, kBlockN);
    w.first = rows.x, w.end = rows.y;
    const int2 keys = segment_range(a.kv_segment_ranges, a.kv_len, b, n0, kBlockN);
    w.one_document = *a.segments_sorted && keys.x == keys.y;
  }
  return w;
}

// From (h, m0) on, the next (query head, block of kBlockM query rows) of K/V head kh whose positions
// and segment ids can see the kBlockN keys from n0 (positions [k_lo, k_hi]; query rows within `window`),
// and its kind; false past the group's last head. Called by whole warps. The candidate at (h, m0) is
// checked by the warp together (the walk's usual case: it is visible); past a hidden one, each lane
// checks its own candidate, 32 at a time, so that a causal block's long run of hidden query blocks (or
// unsorted documents') costs a few rounds instead of one round trip to memory each. A block inside one
// document (QueryWindow) is classified by positions alone: no segment ranges read in the walk's usual step.
template <int kBlockM, int kBlockN, bool kSegments, Positions kFrom = Positions::kComputedWhereRun>
__device__ __forceinline__ bool next_visible_step(const CudaAttentionArgs& a, int b, int kh, int n0, int64_t k_lo,
                                                  int64_t k_hi, QueryWindow window, int lane, int& h, int& m0,
                                                  BlockKind& kind) {
  const int h_end = (kh + 1) * (a.q_heads / a.kv_heads);
  const bool hides = a.causal || a.window_left >= 0 || a.window_right >= 0 || (kSegments && a.q_segment_ranges);
  if (!hides) {  // nothing hides a pair: every step is full
    if (m0 >= a.q_len) ++h, m0 = 0;
    kind = BlockKind::kFull;
    return h < h_end;
  }
  // Every head walks the same rows: [start, end) with segment ids, all of them otherwise.
  const int start = kSegments ? window.first / kBlockM * kBlockM : 0, end = kSegments ? min(window.end, a.q_len) : a.q_len;
  if constexpr (kSegments) m0 = max(m0, start);
  if (m0 >= end) ++h, m0 = start;
  if (h >= h_end) return false;
  // Whether the block from m row lies inside the keys' one document: past the window's first chunk and
  // before its last.
  auto in_document = [&](int m) {
    return kSegments && window.one_document && m >= window.first + kSegmentChunkRows &&
           m + kBlockM <= (end - 1) / kSegmentChunkRows * kSegmentChunkRows;
  };
  // Read where needed rather than held across the walk (registers the kernels spill otherwise).
  auto key_segments = [&] {
    return kSegments && a.kv_segment_ranges ? segment_range(a.kv_segment_ranges, a.kv_len, b, n0, kBlockN) : int2{};
  };
  if (a.pos.queries_sorted) {  // the block's first and last rows bound it: no scan
    kind = in_document(m0) ? lane_block_kind<kBlockM, false, kFrom>(a, b, int2{}, m0, k_lo, k_hi)
                           : lane_block_kind<kBlockM, kSegments, kFrom>(a, b, key_segments(), m0, k_lo, k_hi);
  } else {
    int64_t q_lo, q_hi;
    position_range(a.pos.q, m0, kBlockM, a.q_len, lane, q_lo, q_hi);
    kind = classify_block(q_lo, q_hi, k_lo, k_hi, a.causal, a.window_left, a.window_right);
    if (kSegments && a.q_segment_ranges && !in_document(m0))
      kind = with_segments(a, kind, segment_range(a.q_segment_ranges, a.q_len, b, m0, kBlockM), key_segments());
  }
  if (kind != BlockKind::kSkip) return true;
  const int2 k_seg = key_segments();
  m0 += kBlockM;
  for (; h < h_end; ++h, m0 = start)
    for (; m0 < end; m0 += 32 * kBlockM) {
      const int mine_m0 = m0 + lane * kBlockM;
      const BlockKind mine = !kSegments || mine_m0 < end
                                 ? lane_block_kind<kBlockM, kSegments, kFrom>(a, b, k_seg, mine_m0, k_lo, k_hi)
                                 : BlockKind::kSkip;
      const unsigned visible = __ballot_sync(0xffffffffu, mine != BlockKind::kSkip);
      if (visible) {
        const int first = __ffs(visible) - 1;
        m0 += first * kBlockM;
        kind = static_cast<BlockKind>(__shfl_sync(0xffffffffu, static_cast<int>(mine), first));
        return true;
      }
    }
  return false;
}

// A step's query segment ids into shared memory beside its rows (4-byte copies; rows past the end read
// 0): the masked steps compare them there, as they read LSE (ids held in registers, or read per element
// from global memory, cost the kernels spills).
template <int kBlockM, bool kSegments>
__device__ __forceinline__ void load_step_segments(const CudaAttentionArgs& a, int32_t* dst, int b, int m0, int tid) {
  if (!kSegments || !a.q_segment_ids.data || tid >= kBlockM) return;
  const int row = m0 + tid;
  copy_4(dst + tid, static_cast<const int32_t*>(a.q_segment_ids.data) + b * a.q_segment_ids.stride[0] +
                        int64_t(row < a.q_len ? row : 0) * a.q_segment_ids.stride[1], row < a.q_len);
}

// Whether the step's query column qcol (ids in shared memory) and key row `key` share a segment (true
// without segment ids).
template <bool kSegments>
__device__ __forceinline__ bool same_segment(const CudaAttentionArgs& a, const int32_t* step_segments, int qcol, int b,
                                             int key) {
  return !kSegments || !a.q_segment_ids.data || step_segments[qcol] == segment_id(a.kv_segment_ids, b, key);
}

// The query columns of a step of kBlockM rows from m0 that see each of a thread's two keys (causal, window),
// where the step's queries sit at consecutive positions (every layout's steps but those across a chunk's
// edge): found once per key, they replace positions read and compared per pair (`consecutive` false: the
// pairs are compared by position).
struct StepColumns {
  int64_t q_first = 0;
  bool consecutive = false;
  int2 cols[2] = {};
  __device__ bool sees(int qcol, int key) const { return qcol >= cols[key].x && qcol < cols[key].y; }
};
template <int kBlockM>
__device__ __forceinline__ StepColumns step_columns(const CudaAttentionArgs& a, int m0, const bool (&key_in)[2],
                                                    const int64_t (&key_pos)[2]) {
  StepColumns step;
  const int width = min(kBlockM, a.q_len - m0);
  step.q_first = q_position(a.pos, m0);
  step.consecutive = a.pos.queries_sorted && q_position(a.pos, m0 + width - 1) - step.q_first == width - 1;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    step.cols[i] = key_in[i] && step.consecutive ? seeing_columns(a, key_pos[i], step.q_first, width) : make_int2(0, 0);
  return step;
}

// dS of one pair (query row `query`, key position kpos of batch b, head h) added into dBias at the bias's
// broadcast shape (its broadcast dimensions have stride 0: every pair they fold together meets there).
__device__ __forceinline__ void add_dbias(const FlashBackwardArgs& g, int b, int h, int query, int64_t kpos, float ds) {
  atomicAdd(static_cast<float*>(const_cast<void*>(g.dbias.data)) + b * g.dbias.stride[0] + h * g.dbias.stride[1] +
                int64_t(query) * g.dbias.stride[2] + kpos * g.dbias.stride[3],
            ds);
}

// The soft cap's derivative 1 - tanh^2 at a pair of probability p > 0, tanh recovered rather than kept
// (no live value more): the capped logit is log2 p + LSE less the bias, all in log2 units.
__device__ __forceinline__ float soft_cap_slope(float p, float lse_log2, float bias_log2, float cap) {
  const float t = fminf(fmaxf((__log2f(p) + lse_log2 - bias_log2) / (cap * kLog2e), -1.0f), 1.0f);
  return 1.0f - t * t;
}

// This block's key block: one launch covers them all, or under --deterministic a round of them.
__device__ __forceinline__ int key_block(const FlashBackwardArgs& g) { return g.first_key_block + blockIdx.x; }

// Where this block adds dQ: the accumulator, or under --deterministic the slice of its place in the
// round, which the same place of the next round adds to after it: one thread adds each element, in the
// rounds' order.
__device__ __forceinline__ float* dq_target(const FlashBackwardArgs& g) { return g.dq + blockIdx.x * g.dq_slice_size; }

// --deterministic on the wgmma backward: this key block's turn to add dQ into a block of query rows
// (FlashBackwardArgs::dq_turns). Its rank is the number of key blocks above it that add there, each of
// which moves the counter on by one after its adds; the counter is read early by one thread (relaxed: an
// acquire load there held its warp, and so its warpgroup's next wgmma, for the read's whole latency) and
// waited on only where it has not reached the rank yet.
struct DqTurn {
  int* counter = nullptr;
  int rank = 0, seen = -1;
};

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int load_relaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The turn of key block `block` (of K/V head kh) at query block qb of query head h, its counter read now.
__device__ __forceinline__ DqTurn peek_dq_turn(const FlashBackwardArgs& g, int b, int kh, int h, int qb, int block) {
  const int64_t writers = ((int64_t(b) * g.a.kv_heads + kh) * g.q_blocks + qb) * g.dq_writer_words + block / 32;
  const uint32_t above = uint32_t(uint64_t(g.dq_writers[writers]) >> (block % 32 + 1));
  DqTurn turn;
  turn.counter = g.dq_turns + (int64_t(b) * g.a.q_heads + h) * g.q_blocks + qb;
  turn.rank = g.dq_writers_after[writers] + __popc(above);
  turn.seen = load_relaxed(turn.counter);
  return turn;
}

// Waits (one thread) until every key block above this one has added its dQ here. A launch whose blocks
// did not run in order would wait forever: after about ten seconds the kernel traps instead of hanging.
__device__ __forceinline__ void wait_dq_turn(DqTurn& turn) {
  if (turn.seen == turn.rank) {  // read relaxed, early: the fence makes it an acquire (measured free)
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    return;
  }
  for (unsigned spins = 0; (turn.seen = load_acquire(turn.counter)) != turn.rank; ++spins) {
    if (spins > (1u << 26)) __trap();
    __nanosleep(64);
  }
}

// Hands the turn on (one thread, after a barrier that follows every thread's adds): the fence makes the
// block's adds visible before the counter moves.
__device__ __forceinline__ void pass_dq_turn(const DqTurn& turn) {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(turn.counter), "r"(turn.rank + 1) : "memory");
}

// dQ's fragment (rows row0 and row0 + 8, columns col0 + 8j + 2t, +1) times the scale, added to the
// f32 accumulator. The atomics bound the backward (one per element per key block): on sm_90 lanes t
// and t ^ 1 trade values so that each adds 4 consecutive floats in one 16-byte atomic, even lanes of
// tile j and odd lanes of tile j + 1, so that a quad covers 64 bytes of one row and a warp's atomic 8
// rows rather than 16 (fewer lines per instruction: measured 3-10% faster backward on H100).
template <bool kPadded, int kTiles>
__device__ __forceinline__ void add_dq_rows(const FlashBackwardArgs& g, const float (&dq)[kTiles][4], int b, int h,
                                            int row0, int col0, int lane) {
  const CudaAttentionArgs& a = g.a;
  const int t = lane % 4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(kTiles % 2 == 0, "tiles in pairs");
  const bool even = t % 2 == 0;
  const int col = col0 + 2 * (t & ~1) + (even ? 0 : 8);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half;
    float* out = dq_target(g) + ((int64_t(b) * a.q_len + row) * a.q_heads + h) * a.head_dim + col;
#pragma unroll
    for (int j = 0; j < kTiles; j += 2) {
      const float send0 = even ? dq[j + 1][2 * half] : dq[j][2 * half];
      const float send1 = even ? dq[j + 1][2 * half + 1] : dq[j][2 * half + 1];
      const float got0 = __shfl_xor_sync(0xffffffffu, send0, 1), got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
      const float4 v = even ? make_float4(dq[j][2 * half], dq[j][2 * half + 1], got0, got1)
                            : make_float4(got0, got1, dq[j + 1][2 * half], dq[j + 1][2 * half + 1]);
      if (row < a.q_len && (!kPadded || col + j * 8 < a.head_dim))
        atomicAdd(reinterpret_cast<float4*>(out + j * 8), make_float4(v.x * a.scale, v.y * a.scale, v.z * a.scale, v.w * a.scale));
    }
  }
#else
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + i * 8;
    if (row >= a.q_len) continue;
    float* out = dq_target(g) + ((int64_t(b) * a.q_len + row) * a.q_heads + h) * a.head_dim + col0 + 2 * t;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      if (kPadded && col0 + j * 8 >= a.head_dim) break;
      atomicAdd(out + j * 8, dq[j][2 * i] * a.scale);
      atomicAdd(out + j * 8 + 1, dq[j][2 * i + 1] * a.scale);
    }
  }
#endif
}

// The block's dK (times the scale: Q entered unscaled) and dV of keys key0 and key0 + 8 (this thread's
// fragment rows), columns col0 + 8j + 2t, +1, added into the accumulators (the block is the only writer
// of these keys' rows), or written in the input dtype where the call asked for them directly. kPadded:
// columns past head_dim (dK) or value_dim (dV) are the instance's zero padding and are not stored.
template <typename T, bool kPadded, int kTiles>
__device__ __forceinline__ void add_dk_dv_rows(const FlashBackwardArgs& g, const float (&dk)[kTiles][4],
                                               const float (&dv)[kTiles][4], int b, int kh, int key0, int col0,
                                               int lane) {
  const CudaAttentionArgs& a = g.a;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = key0 + i * 8;
    if (key >= a.kv_len) continue;
    const int64_t row = (int64_t(b) * a.kv_len + key) * a.kv_heads + kh;
    const int64_t k_at = row * a.head_dim + col0 + (lane % 4) * 2;
    const int64_t v_at = kPadded ? row * a.value_dim + col0 + (lane % 4) * 2 : k_at;
    auto stored = [&](int j, int cols) { return !kPadded || col0 + j * 8 < cols; };
    if (g.dk_direct) {
      uint32_t* dk_out = reinterpret_cast<uint32_t*>(static_cast<T*>(g.dk_direct) + k_at);
      uint32_t* dv_out = reinterpret_cast<uint32_t*>(static_cast<T*>(g.dv_direct) + v_at);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        if (stored(j, a.head_dim)) dk_out[j * 4] = pack2<T>(dk[j][2 * i] * a.scale, dk[j][2 * i + 1] * a.scale);
        if (stored(j, a.value_dim)) dv_out[j * 4] = pack2<T>(dv[j][2 * i], dv[j][2 * i + 1]);
      }
      continue;
    }
    // A row's loads before its stores, so that no load waits behind a store the compiler cannot tell
    // apart from it. Measured on 2 H100 in the ring's steps: no faster, no slower than the interleaved
    // form (bench/RESULTS.md, "The ring backward's device time per step").
    float2 was[kTiles];
    auto add_into = [&](float2* out, const float (&grad)[kTiles][4], int cols, float scale) {
#pragma unroll
      for (int j = 0; j < kTiles; ++j) was[j] = stored(j, cols) ? out[j * 4] : float2{};
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
        if (stored(j, cols))
          out[j * 4] = make_float2(was[j].x + grad[j][2 * i] * scale, was[j].y + grad[j][2 * i + 1] * scale);
    };
    add_into(reinterpret_cast<float2*>(g.dk + k_at), dk, a.head_dim, a.scale);
    add_into(reinterpret_cast<float2*>(g.dv + v_at), dv, a.value_dim, 1.0f);
  }
}

}  // namespace ra::flash
