// A boolean mask summarised per tile for the wgmma kernels' mask instances, by one small kernel per call (it reads the
// whole mask once: 89 us for 256 MB on an H100): which tiles of 64 query rows x 128 keys the mask hides whole, and
// which it keeps whole. The forward leaves out the key tiles before a block's first kept one and after its last; the
// backward walks only the steps a key block's mask keeps a pair of, and neither stages nor reads the mask of a step it
// keeps whole. A chunked, banded or block-diagonal mask (Llama 4's chunked attention, a document mask, Transformers'
// dense masks of either) then costs about the pairs it keeps, as FlexAttention's block mask.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/cuda/cuda_inputs.h"

namespace ra {

constexpr int kMaskChunkRows = 64, kMaskTileKeys = 128;  // the summary's tile: both mask instances' kBlockN keys
constexpr uint8_t kMaskTileSome = 1, kMaskTileAll = 2;   // DeviceMaskTiles::states' bits (All: every in-range pair)

// Fills args.mask_tiles when args has a mask (nothing otherwise, nor where a grid would not hold its chunks), from a
// call temporary queued on `stream` and released there when this object dies: keep it alive until the kernel that
// reads it is queued.
class MaskTiles {
 public:
  MaskTiles(CudaAttentionArgs& args, cudaStream_t stream);
  ~MaskTiles();
  MaskTiles(const MaskTiles&) = delete;
  MaskTiles& operator=(const MaskTiles&) = delete;

 private:
  void* summary_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace ra
