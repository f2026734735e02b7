// What the CUDA kernels read: raw device pointers with element strides, and token positions already
// on the device. Built once per call on the host (cuda_inputs.cc) from validated AttentionInputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>

#include "attention/carry.h"
#include "attention/inputs.h"
#include "attention/params.h"
#include "runtime/cuda_device.h"
#include "runtime/tensor.h"

namespace ra {

// Token positions in device memory (int64, as in TokenPositions).
struct DevicePositions {
  const int64_t* q = nullptr;  // T entries: key-axis position of each local query row
  const int64_t* k = nullptr;  // S entries: global index of each local key row
  int64_t total_keys = 0;
  bool keys_sorted = false;    // k ascending: a tile's key range is its first and last entry
  const int64_t* q_host = nullptr;  // the same positions on the host, when the caller has them
  const int64_t* k_host = nullptr;  //   (cudnn splits blocks by them)
  bool queries_sorted = false;       // q ascending: a block of rows' range is its first and last entry
  // Where every entry is the first plus its index (run_start: a single call's positions, the contiguous
  // layout's), that first, else kNotARun: the kernels then compute a position rather than wait for its read.
  static constexpr int64_t kNotARun = INT64_MIN;
  int64_t q_run = kNotARun, k_run = kNotARun;
  static int64_t run_of(std::span<const int64_t> positions) { return run_start(positions).value_or(kNotARun); }
  // Whether the keys pair up as dropout's decisions do (dropout_keys_pair_up), where the caller found it once (a
  // ring's blocks); unknown: a launch that needs it scans k_host.
  enum class KeyPairing : int8_t { kUnknown, kPairs, kApart };
  KeyPairing key_pairing = KeyPairing::kUnknown;

  // The positions of the keys from row `first` on (a block of them): every view of the keys moves together. Keys
  // that pair up from a multiple of 16 still do; any other answer is unknown again.
  DevicePositions keys_from(int64_t first) const {
    DevicePositions block = *this;
    block.k += first;
    if (block.k_host != nullptr) block.k_host += first;
    if (block.k_run != kNotARun) block.k_run += first;
    if (block.key_pairing != KeyPairing::kPairs || first % 16 != 0) block.key_pairing = KeyPairing::kUnknown;
    return block;
  }
};

// A strided 4-D device view (unused dims have stride 0).
struct DeviceView4 {
  const void* data = nullptr;
  int64_t stride[4] = {0, 0, 0, 0};
};

// A boolean mask summarised per tile (MaskTiles, mask_tiles.h) for the wgmma kernels' mask instances: per map (the
// mask's own batch rows x heads, 1 each where broadcast), 64-row chunk of query rows and 128-key tile of keys, whether
// the mask keeps some or all of the tile's pairs (kMaskTileSome / kMaskTileAll); per chunk the first and last tile
// with a kept pair, per tile the first and last chunk (first > last: none).
struct DeviceMaskTiles {
  const uint8_t* states = nullptr;  // (maps, key_tiles, row_chunks): a key tile's in a row; null: not summarised
  const int* firsts = nullptr;      // (maps, row_chunks), then (maps, key_tiles)
  const int* lasts = nullptr;       // likewise
  int maps = 0, heads = 1, row_chunks = 0, key_tiles = 0;
  bool per_batch = false;
};

struct CudaAttentionArgs {
  DeviceView4 q, k, v;             // (B, T, Hq, D), (B, S, Hkv, D), (B, S, Hkv, Dv); last stride 1
  DeviceView4 bias, mask;          // broadcast to (B, Hq, T, S_total); data null when absent
  DeviceView4 q_segment_ids, kv_segment_ids;  // (B, T), (B, S) in dims 0 and 1
  // With segment ids, the [min, max] of each 64-row chunk of them, (B, chunks) each: filled for the
  // flash kernels by SegmentRanges (segment_ranges.h), null otherwise.
  const int2* q_segment_ranges = nullptr;
  const int2* kv_segment_ranges = nullptr;
  // Per chunk likewise, the rows of the other side its ids can meet, [x, y): the rows of its documents
  // where both sides' ids never decrease along the rows (packed documents), else all of them.
  const int2* q_key_windows = nullptr;
  const int2* kv_query_windows = nullptr;
  const int* segments_sorted = nullptr;  // non-zero where both sides' ids never decrease (device memory)
  DeviceMaskTiles mask_tiles;  // filled by MaskTiles where a mask instance runs
  uint64_t mask_identity = 0;  // AttentionInputs::mask_identity (host side: MaskTiles keeps a named mask's summary)
  DevicePositions pos;
  int batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0, value_dim = 0;
  float scale = 1.0f, soft_cap = 0.0f, dropout_prob = 0.0f;
  uint64_t dropout_seed = 0;
  int64_t batch_offset = 0, head_offset = 0;  // dropout's global batch and head of index 0 (AttentionParams)
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  FlashKernel flash_kernel = FlashKernel::kAuto;  // which flash_attn2 kernels run (AttentionParams)
  float* numerator = nullptr;      // the carry, (B, Hq, T, Dv) and (B, Hq, T) f32
  float* denominator = nullptr;
  float* max = nullptr;
  // A single call's outputs (AttentionImpl::forward_direct): when o_direct is set, the kernel starts from
  // an empty carry and ends by writing O ((B, T, Hq, Dv), q's dtype or f32) and LSE ((B, Hq, T)), the
  // sinks folded in, instead of reading and writing the carry (the wgmma forward; see flash_cuda.h).
  void* o_direct = nullptr;
  float* lse_direct = nullptr;
  bool o_f32 = false;
  const float* sinks = nullptr;
  int64_t sink_stride = 0;
  // The kernel queued just before this one on the stream writes nothing this one reads but the carry
  // (the ring's previous block): this one may start while it runs, waiting for it only before its
  // carry is read (programmatic dependent launch; the sm_90a flash kernel, others ignore it).
  bool after_carry_writer = false;
};

// Checks that every tensor of `in` and the carry live in CUDA memory (naming the first that does not)
// and fills the arguments. `pos` must already be on the device.
CudaAttentionArgs make_cuda_args(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                                 Carry& carry);
// The same without a carry (the backward's kernels): the carry pointers stay null.
CudaAttentionArgs make_cuda_args(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params);

// out[0, q_count) = q_first + i, then out[q_count, q_count + k_count) = k_first + j, queued on `stream`.
void fill_position_runs_cuda(int64_t* out, int64_t q_count, int64_t q_first, int64_t k_count, int64_t k_first,
                             cudaStream_t stream);

// Device copies of host positions, reused across calls (grows as needed).
class DevicePositionBuffer {
 public:
  // Copies on `stream` from a pinned staging area; the result is valid for work queued on `stream`.
  // Waits only for the previous call's copy out of the staging area, not for the stream; positions equal
  // to the last ones uploaded are not copied again (`stream` waits for that copy, the host does not).
  // Where `stream` is being captured into a CUDA graph, positions that are runs (a single call's) are
  // written by a kernel into a temporary of the captured call instead; others are refused by name.
  DevicePositions upload(const TokenPositions& pos, cudaStream_t stream);

 private:
  static DevicePositions describe(const TokenPositions& pos, int64_t* device);

  Tensor device_, staging_;  // grow-only (reserve_scratch); staging_ keeps the last positions uploaded
  size_t uploaded_count_ = 0;  // how many positions the last upload held
  std::unique_ptr<CudaEvent> copied_;  // after the last copy out of staging_
};

}  // namespace ra
