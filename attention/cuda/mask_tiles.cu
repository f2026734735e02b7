#include "attention/cuda/mask_tiles.h"

#include <climits>

#include "attention/cuda/mask_tile.cuh"
#include "runtime/cuda_device.h"

namespace ra {
namespace {

constexpr int kThreads = 128, kKeyChunks = kMaskTileKeys / 16;  // a thread reads 16 keys of every 16th row

constexpr int kPasses = kMaskChunkRows / (kThreads / kKeyChunks);  // rows a thread reads

// Whether each of the 16 bytes in `words` is non-zero (some, all).
__device__ __forceinline__ void kept_of_16(const uint32_t (&words)[4], bool& some, bool& all) {
#pragma unroll
  for (uint32_t w : words) {
    some = some || w != 0;
    all = all && ((w - 0x01010101u) & ~w & 0x80808080u) == 0;  // no zero byte
  }
}

// 16 bytes from `from` as words: four of 4 bytes where 4-byte aligned, else byte by byte.
__device__ __forceinline__ void words_of_16(const uint8_t* from, uint32_t (&words)[4]) {
  if (reinterpret_cast<uintptr_t>(from) % 4 == 0) {
    for (int i = 0; i < 4; ++i) words[i] = reinterpret_cast<const uint32_t*>(from)[i];
  } else {
    for (int i = 0; i < 4; ++i)
      words[i] = from[4 * i] | from[4 * i + 1] << 8 | from[4 * i + 2] << 16 | uint32_t(from[4 * i + 3]) << 24;
  }
}

// One block per (key tile, row chunk, map): whether the mask keeps some / all of the tile's pairs in range (as the
// mask instances read it: local query rows, keys by position), and the chunk's and tile's ranges widened to it.
__global__ void mask_tiles_kernel(const __grid_constant__ CudaAttentionArgs a, uint8_t* states, uint8_t* states_by_tile,
                                  int* firsts, int* lasts) {
  const DeviceMaskTiles& t = a.mask_tiles;
  const int tile = blockIdx.x, chunk = blockIdx.y, map = blockIdx.z;
  const int key0 = tile * kMaskTileKeys + 16 * int(threadIdx.x % kKeyChunks), r0 = threadIdx.x / kKeyChunks;
  const DeviceView4& mask = a.mask;
  const uint8_t* head =
      static_cast<const uint8_t*>(mask.data) + (map / t.heads) * mask.stride[0] + (map % t.heads) * mask.stride[1];
  const int keys_in = min(16, a.kv_len - key0);
  int64_t first_pos = 0;
  const bool run = flash::mask_keys_run(a, key0, keys_in, first_pos);
  bool some = false, all = true;
  if (run && (reinterpret_cast<uintptr_t>(head + first_pos) | uintptr_t(mask.stride[2])) % 16 == 0) {
    // Every row's 16 bytes aligned: the thread's rows as 16-byte loads, all in flight at once (the summary reads the
    // whole mask, a GB at T = S = 32768: at the memory's rate, not at its latency).
    uint4 v[kPasses];
#pragma unroll
    for (int n = 0; n < kPasses; ++n) {
      const int r = chunk * kMaskChunkRows + r0 + n * (kThreads / kKeyChunks);
      if (r < a.q_len) v[n] = *reinterpret_cast<const uint4*>(head + int64_t(r) * mask.stride[2] + first_pos);
    }
#pragma unroll
    for (int n = 0; n < kPasses; ++n)
      if (chunk * kMaskChunkRows + r0 + n * (kThreads / kKeyChunks) < a.q_len) {
        const uint32_t words[4] = {v[n].x, v[n].y, v[n].z, v[n].w};
        kept_of_16(words, some, all);
      }
  } else {
    for (int r = chunk * kMaskChunkRows + r0; r < min((chunk + 1) * kMaskChunkRows, a.q_len); r += kThreads / kKeyChunks) {
      const uint8_t* row = head + int64_t(r) * mask.stride[2];
      if (run) {
        uint32_t words[4];
        words_of_16(row + first_pos, words);
        kept_of_16(words, some, all);
      } else {
        for (int i = 0; i < keys_in; ++i) {
          const bool kept = row[flash::k_position(a.pos, key0 + i) * mask.stride[3]] != 0;
          some = some || kept, all = all && kept;
        }
      }
    }
  }
  some = __syncthreads_or(some);
  all = __syncthreads_and(all);
  if (threadIdx.x != 0) return;
  const uint8_t state = some ? kMaskTileSome | (all ? kMaskTileAll : 0) : 0;
  states[(int64_t(map) * t.row_chunks + chunk) * t.key_tiles + tile] = state;
  states_by_tile[(int64_t(map) * t.key_tiles + tile) * t.row_chunks + chunk] = state;
  if (!some) return;
  const int64_t chunk_at = int64_t(map) * t.row_chunks + chunk;
  const int64_t tile_at = int64_t(t.maps) * t.row_chunks + int64_t(map) * t.key_tiles + tile;
  atomicMin(firsts + chunk_at, tile), atomicMax(lasts + chunk_at, tile);
  atomicMin(firsts + tile_at, chunk), atomicMax(lasts + tile_at, chunk);
}

}  // namespace

MaskTiles::MaskTiles(CudaAttentionArgs& a, cudaStream_t stream) : stream_(stream) {
  if (!a.mask.data || a.q_len == 0 || a.kv_len == 0) return;
  DeviceMaskTiles t;
  t.per_batch = a.mask.stride[0] != 0 && a.batch > 1;
  t.heads = a.mask.stride[1] != 0 ? a.q_heads : 1;
  t.maps = (t.per_batch ? a.batch : 1) * t.heads;
  t.row_chunks = (a.q_len + kMaskChunkRows - 1) / kMaskChunkRows;
  t.key_tiles = (a.kv_len + kMaskTileKeys - 1) / kMaskTileKeys;
  if (t.row_chunks > 65535 || t.maps > 65535) return;  // a grid's y and z: left unsummarised (nothing skipped)
  const size_t ranges = size_t(t.maps) * (t.row_chunks + t.key_tiles);
  const size_t states = size_t(t.maps) * t.row_chunks * t.key_tiles;
  summary_ = cuda_allocate_temporary(2 * ranges * sizeof(int) + 2 * states, stream, "the mask's tile summary");
  int* firsts = static_cast<int*>(summary_);
  int* lasts = firsts + ranges;
  uint8_t* state = reinterpret_cast<uint8_t*>(lasts + ranges);
  a.mask_tiles = t;
  // firsts start past any tile or chunk (0x7f7f7f7f), lasts before any (-1): min and max take the kept ones.
  cudaError_t launched = cudaMemsetAsync(firsts, 0x7f, ranges * sizeof(int), stream);
  if (launched == cudaSuccess) launched = cudaMemsetAsync(lasts, 0xff, ranges * sizeof(int), stream);
  if (launched == cudaSuccess) {
    mask_tiles_kernel<<<dim3(unsigned(t.key_tiles), unsigned(t.row_chunks), unsigned(t.maps)), kThreads, 0, stream>>>(
        a, state, state + states, firsts, lasts);
    launched = cudaGetLastError();
  }
  if (launched != cudaSuccess) {
    a.mask_tiles = DeviceMaskTiles{};
    cuda_release_temporary(summary_, stream);
    summary_ = nullptr;
    RA_CUDA_CHECK(launched);
  }
  a.mask_tiles.states = state;
  a.mask_tiles.states_by_tile = state + states;
  a.mask_tiles.firsts = firsts;
  a.mask_tiles.lasts = lasts;
}

MaskTiles::~MaskTiles() {
  if (summary_) cuda_release_temporary(summary_, stream_);
}

}  // namespace ra
