// Segment ids as block ranges for the flash kernels: per 64-row chunk of q's and of k's segment ids
// their [min, max], computed by one small kernel per call. A (query block, key tile) pair whose ranges
// do not meet shares no segment and is skipped whole (packed documents: most of them); a pair inside
// one segment runs unmasked; only pairs across a document edge look at each id.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/cuda/cuda_inputs.h"

namespace ra {

constexpr int kSegmentChunkRows = 64;

// Fills args.q_segment_ranges, args.kv_segment_ranges and args.segment_ids_sorted when args has segment
// ids (nothing otherwise),
// from a call temporary queued on `stream` and released there when this object dies: keep it alive
// until the kernels that read them are queued. With segment ids it clears args.after_carry_writer: a
// kernel launched behind this one's small kernel could read the ranges before they are written.
class SegmentRanges {
 public:
  SegmentRanges(CudaAttentionArgs& args, cudaStream_t stream);
  ~SegmentRanges();
  SegmentRanges(const SegmentRanges&) = delete;
  SegmentRanges& operator=(const SegmentRanges&) = delete;

 private:
  void* ranges_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace ra
