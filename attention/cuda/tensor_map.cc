#include "attention/cuda/tensor_map.h"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include "runtime/cuda_device.h"
#include "runtime/error.h"

namespace ra {
namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point: no link against libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    RA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    RA_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
             "the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a driver for CUDA 12 or later)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

bool encode_row_tiles(CUtensorMap& map, const DeviceView4& view, TileElement element, int64_t batch, int64_t rows,
                      int64_t heads, int64_t cols, int box_rows, int box_cols, int swizzle_bytes) {
  const int64_t kElem = element == TileElement::kF32 ? 4 : 2;
  RA_CHECK(box_cols * kElem == swizzle_bytes && (swizzle_bytes == 64 || swizzle_bytes == 128) && box_rows <= 256,
           "encode_row_tiles: boxes of one swizzle row (64 or 128 bytes) and at most 256 rows");
  const CUtensorMapDataType type = element == TileElement::kF32    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : element == TileElement::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const auto address = reinterpret_cast<uintptr_t>(view.data);
  const int64_t row_stride = view.stride[1] * kElem, head_stride = view.stride[2] * kElem;
  const int64_t batch_stride = view.stride[0] * kElem;
  for (int64_t stride : {row_stride, head_stride, batch_stride})
    if (stride % 16 != 0 || stride <= 0 || stride >= (int64_t(1) << 40)) return false;
  if (address % 16 != 0 || view.stride[3] != 1) return false;
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(row_stride), cuuint64_t(head_stride), cuuint64_t(batch_stride)};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap encoded;
  const CUresult result = tensor_map_encoder()(
      &encoded, type, 4, const_cast<void*>(view.data),
      dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) return false;
  map = encoded;
  return true;
}

CUtensorMap row_tiles_of(const char* tensor, const DeviceView4& view, TileElement element, int64_t batch, int64_t rows,
                         int64_t heads, int64_t cols, int box_rows, int box_cols, int swizzle_bytes) {
  CUtensorMap map{};
  RA_CHECK(encode_row_tiles(map, view, element, batch, rows, heads, cols, box_rows, box_cols, swizzle_bytes),
           "the wgmma flash_attn2 kernels cannot describe ", tensor, " to the TMA unit (rows of 16-byte multiples at a "
           "16-byte aligned address expected; ", tensor, " strides ", view.stride[0], ", ", view.stride[1], ", ",
           view.stride[2], ", ", view.stride[3], ")");
  return map;
}

}  // namespace ra
