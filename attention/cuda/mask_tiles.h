// A boolean mask summarised per tile for the wgmma kernels' mask instances, by one small kernel (it reads the whole
// mask once: 89 us for 256 MB on an H100): which tiles of 64 query rows x 128 keys the mask hides whole, and which it
// keeps whole. The forward leaves out the key tiles before a block's first kept one and after its last; the backward
// walks only the steps a key block's mask keeps a pair of, and neither stages nor reads the mask of a step it keeps
// whole. A chunked, banded or block-diagonal mask (Llama 4's chunked attention, a document mask, Transformers' dense
// masks of either) then costs about the pairs it keeps, as FlexAttention's block mask.
//
// A mask the caller names (CudaAttentionArgs::mask_identity: a model's layers, a forward and its backward, all
// reading one mask) is summarised once: its summary is kept for later calls with the same name, mask address and
// shape, as FlexAttention's block mask is made once for a model's layers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "attention/cuda/cuda_inputs.h"
#include "runtime/tensor.h"

namespace ra {

constexpr int kMaskChunkRows = 64, kMaskTileKeys = 128;  // the summary's tile: both mask instances' kBlockN keys
constexpr uint8_t kMaskTileSome = 1, kMaskTileAll = 2;   // DeviceMaskTiles::states' bits (All: every in-range pair)

struct KeptMaskTiles;  // a summary kept for later calls (mask_tiles.cu)

// Fills args.mask_tiles when args has a mask (nothing otherwise, nor where a grid would not hold its chunks). A named
// mask's summary comes from those kept (made and kept at its first call; never while `stream` is being captured into
// a CUDA graph, whose replays may see other bytes at the mask's address); any other from a call temporary queued on
// `stream`. Keep this object alive until the kernel that reads the summary is queued.
class MaskTiles {
 public:
  MaskTiles(CudaAttentionArgs& args, cudaStream_t stream);
  ~MaskTiles();  // a kept summary: its last use is marked, so that dropping it later waits for that
  MaskTiles(const MaskTiles&) = delete;
  MaskTiles& operator=(const MaskTiles&) = delete;

  // Whether the mask keeps whole at least half the tiles it keeps a pair of (a document mask's inside), known for a
  // kept summary once its counts have come back to the host (read without a wait; false until then): the forward then
  // runs the instance that neither stages nor reads such tiles, which costs a mask that keeps none whole a fifth.
  bool keeps_tiles_whole() const { return keeps_tiles_whole_; }

 private:
  Tensor temporary_;
  std::shared_ptr<KeptMaskTiles> kept_;
  cudaStream_t stream_;
  bool keeps_tiles_whole_ = false;
};

// How many kept summaries there are now (for the tests); each is a few hundred KB at most (a byte a tile).
int kept_mask_tiles_count();

}  // namespace ra
