// A step's tile of the boolean mask staged in shared memory, for the wgmma kernels' mask instances: read per
// pair from global memory (the extras instances' way), with 64-bit index arithmetic on the path of every
// probability, a mask ran the kernels at a tenth of their rate; staged by cp.async while the tensor cores work,
// a pair's mask is one byte of a conflict-free shared-memory read.
#pragma once

#include <cstdint>

#include "attention/cuda/bias_tile.cuh"
#include "attention/cuda/cuda_inputs.h"
#include "attention/cuda/flash_tile.cuh"
#include "attention/cuda/mask_tiles.h"

namespace ra::flash {

// Whether a call's extras are a boolean mask, alone or beside dropout (no bias, soft cap or segment ids), which the
// wgmma kernels' mask instances take at the head dims they have them for.
inline bool flash_takes_mask_instance(const CudaAttentionArgs& a) {
  return a.mask.data && !a.bias.data && flash_positions_beside_staged_tile(a);
}

// Bytes between a mask tile's rows for kKeys keys: 16 more, so that rows start 16-byte aligned (cp.async) and a
// fragment's rows (8 apart in the forward, 2 apart in the backward) fall into different banks.
template <int kKeys>
constexpr int kMaskStride = kKeys + 16;

// 16 bytes global -> shared (`to` 16-byte aligned) by one copy where the source allows it, else four of 4 bytes,
// else byte by byte (a row of an odd length); zeros where `valid` is false, stored rather than copied (cp.async
// wants an aligned source even when it reads none).
__device__ __forceinline__ void copy_16_any_alignment(uint8_t* to, const uint8_t* from, bool valid) {
  if (!valid) {
    *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
    return;
  }
  const uintptr_t address = reinterpret_cast<uintptr_t>(from);
  if (address % 16 == 0) return copy_16(to, from, true);
  if (address % 4 == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) copy_4(to + 4 * i, from + 4 * i, true);
    return;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) to[i] = from[i];
}

// Whether 16 keys from key0 (keys_in of them in range) are one run of a mask row's bytes, from its byte first_pos:
// all in range, at consecutive positions (a run, or sorted keys that fill their range) and the mask's key stride 1.
__device__ __forceinline__ bool mask_keys_run(const CudaAttentionArgs& a, int key0, int keys_in, int64_t& first_pos) {
  if (keys_in < 16 || a.mask.stride[3] != 1) return false;
  first_pos = k_position(a.pos, key0);
  return a.pos.k_run != DevicePositions::kNotARun || (a.pos.keys_sorted && k_position(a.pos, key0 + 15) == first_pos + 15);
}

// The mask (u8, broadcast to (B, Hq, T, S_total): CudaAttentionArgs::mask; 0 hides a pair) of query rows m0..
// and keys n0.. of (batch b, head h) into `tile`, rows kStride bytes apart, by kThreads threads (tid counted among
// them), each copying the same 16 keys of several rows: as 16 bytes in a row where the keys' positions are
// consecutive (a run, or sorted keys that fill their range: TileKeys' test) and the mask's key stride is 1, else
// pair by pair. Rows and keys past the ends read as zeros (those pairs are hidden anyway). Committed by the
// caller; the pair-by-pair copies are plain stores, visible after the caller's barrier.
template <int kRows, int kKeys, int kStride, int kThreads>
__device__ __forceinline__ void load_mask_tile(uint8_t* tile, const CudaAttentionArgs& a, int b, int h, int m0, int n0,
                                               int tid) {
  constexpr int kChunks = kKeys / 16, kRowsPerPass = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kRowsPerPass == 0, "every thread copies the same rows");
  static_assert(kStride % 16 == 0, "rows of 16 bytes");
  const int chunk = tid % kChunks, r0 = tid / kChunks, key0 = n0 + 16 * chunk;
  const DeviceView4& mask = a.mask;
  const uint8_t* head = static_cast<const uint8_t*>(mask.data) + b * mask.stride[0] + h * mask.stride[1];
  const int keys_in = min(16, a.kv_len - key0);  // <= 0: the chunk is past the end
  int64_t first_pos = 0;
  const bool run = mask_keys_run(a, key0, keys_in, first_pos);
#pragma unroll
  for (int n = 0; n < kRows / kRowsPerPass; ++n) {
    const int r = r0 + n * kRowsPerPass;
    const bool row_in = m0 + r < a.q_len;
    const uint8_t* row = head + (row_in ? int64_t(m0 + r) * mask.stride[2] : 0);
    uint8_t* to = tile + r * kStride + 16 * chunk;
    if (run || !row_in || keys_in <= 0) {
      copy_16_any_alignment(to, row + first_pos, run && row_in);
    } else {
      for (int i = 0; i < 16; ++i) to[i] = i < keys_in ? row[k_position(a.pos, key0 + i) * mask.stride[3]] : 0;
    }
  }
}

// The summary (MaskTiles) of batch b, head h's mask.
__device__ __forceinline__ int mask_tiles_map(const DeviceMaskTiles& t, int b, int h) {
  return (t.per_batch ? b : 0) * t.heads + (t.heads > 1 ? h : 0);
}

// Where the summary's arrays (DeviceMaskTiles) hold one map's entries: the state of a key tile at a row chunk (a key
// tile's chunks in a row), a row chunk's range of kept tiles, and a key tile's range of kept chunks.
__device__ __forceinline__ int64_t mask_state_at(const DeviceMaskTiles& t, int map, int tile, int chunk) {
  return (int64_t(map) * t.key_tiles + tile) * t.row_chunks + chunk;
}
__device__ __forceinline__ int64_t mask_chunk_range_at(const DeviceMaskTiles& t, int map, int chunk) {
  return int64_t(map) * t.row_chunks + chunk;
}
__device__ __forceinline__ int64_t mask_tile_range_at(const DeviceMaskTiles& t, int map, int tile) {
  return int64_t(t.maps) * t.row_chunks + int64_t(map) * t.key_tiles + tile;
}

// What the mask keeps of rows [m0, m0 + kRows) (whole 64-row chunks) of a key tile whose chunks' states (row_chunks of
// them) are `chunk_states`: kMaskTileSome where it keeps a pair, with kMaskTileAll where it keeps every pair in range.
// Chunks past the rows' end count for neither.
template <int kRows>
__device__ __forceinline__ uint8_t rows_state(const uint8_t* chunk_states, int row_chunks, int m0) {
  static_assert(kRows % kMaskChunkRows == 0, "whole chunks");
  uint8_t some = 0, all = kMaskTileAll;
#pragma unroll
  for (int c = 0; c < kRows / kMaskChunkRows; ++c) {
    const int chunk = m0 / kMaskChunkRows + c;
    if (chunk >= row_chunks) break;
    const uint8_t state = chunk_states[chunk];
    some |= state & kMaskTileSome, all &= state;
  }
  return some ? some | all : 0;
}

// The key tiles [first, last] of a block of kRows rows from m0 narrowed to those between its chunks' first and last
// tile with a kept pair (first > last: none).
template <int kRows>
__device__ __forceinline__ void narrow_to_mask_tiles(const DeviceMaskTiles& t, int map, int m0, int& first, int& last) {
  int lo = INT_MAX, hi = -1;
#pragma unroll
  for (int c = 0; c < kRows / kMaskChunkRows; ++c) {
    const int chunk = m0 / kMaskChunkRows + c;
    if (chunk >= t.row_chunks) break;
    lo = min(lo, t.firsts[mask_chunk_range_at(t, map, chunk)]);
    hi = max(hi, t.lasts[mask_chunk_range_at(t, map, chunk)]);
  }
  first = max(first, lo), last = min(last, hi);
}

// A key tile's column of the summary in shared memory, for the backward's walk over query rows: each row chunk's
// state and the query rows [rows_first, rows_end) of the chunks the mask keeps a pair in (empty: none), of one map
// (the mask of one head where it has heads of its own). Read from shared memory, a step's state costs the walk no
// round trip to L2 (one a step cost the backward 12%). Up to kMaskColumnChunks chunks (512K query rows: a mask
// that many rows long would not fit a GPU beside its keys; past it the walk stages every step's mask).
constexpr int kMaskColumnChunks = 8192;
struct MaskColumn {
  int rows_first, rows_end, map;
  uint8_t states[kMaskColumnChunks];
};

// Fills `column` with map `map`'s column of key tile `tile`, by kThreads threads (tid counted among them), between
// two of the caller's barriers.
template <int kThreads>
__device__ __forceinline__ void fill_mask_column(MaskColumn& column, const DeviceMaskTiles& t, int map, int tile, int tid) {
  const uint8_t* from = t.states + mask_state_at(t, map, tile, 0);
  for (int c = tid; c < t.row_chunks; c += kThreads) column.states[c] = from[c];
  if (tid == 0) {
    const int64_t at = mask_tile_range_at(t, map, tile);
    const int first = t.firsts[at], last = t.lasts[at];
    column.rows_first = first > last ? 0 : first * kMaskChunkRows;
    column.rows_end = first > last ? 0 : (last + 1) * kMaskChunkRows;
    column.map = map;
  }
}

}  // namespace ra::flash
