// Tensor maps for the TMA loads of the Hopper kernels (tma.cuh): how the copy engine finds a tile of a
// (batch, rows, heads, columns) view in global memory and lays it out in shared memory.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "attention/cuda/cuda_inputs.h"

namespace ra {

enum class TileElement { kBF16, kF16, kF32 };

// The 16-bit element type T of the kernels' instances (__nv_bfloat16 or __half) as a TileElement.
template <typename T>
constexpr TileElement tile_element_of() {
  return std::is_same_v<T, __nv_bfloat16> ? TileElement::kBF16 : TileElement::kF16;
}

// A map of `view` (last stride 1) as boxes of box_rows rows x box_cols columns of one (batch, head),
// swizzled in rows of swizzle_bytes (64 or 128, as wgmma's operand tiles; a box's row of columns must
// fill one); columns past `cols` and rows past `rows` load as zeros and are never stored. False (map
// untouched) where TMA cannot address the view: its address or a stride not a multiple of 16 bytes.
bool encode_row_tiles(CUtensorMap& map, const DeviceView4& view, TileElement element, int64_t batch, int64_t rows,
                      int64_t heads, int64_t cols, int box_rows, int box_cols, int swizzle_bytes);

// encode_row_tiles' map of `tensor`'s view, or an error naming the tensor, its strides and what TMA needs
// (the flash kernels' checks admit only views it can map).
CUtensorMap row_tiles_of(const char* tensor, const DeviceView4& view, TileElement element, int64_t batch, int64_t rows,
                         int64_t heads, int64_t cols, int box_rows, int box_cols, int swizzle_bytes);

// The maps of a call's k and v that a kernel loads its key tiles by: boxes of box_rows keys x 64 columns,
// 128-byte swizzled as wgmma's slabs. A kernel parameter of their own (`const __grid_constant__`: TMA reads
// a map in parameter space) beside the kernel's arguments, which other kernels share.
struct KvMaps {
  CUtensorMap k, v;
};
template <typename T>
KvMaps key_tiles_of(const CudaAttentionArgs& a, int box_rows) {
  return {row_tiles_of("k", a.k, tile_element_of<T>(), a.batch, a.kv_len, a.kv_heads, a.head_dim, box_rows, 64, 128),
          row_tiles_of("v", a.v, tile_element_of<T>(), a.batch, a.kv_len, a.kv_heads, a.value_dim, box_rows, 64, 128)};
}

}  // namespace ra
