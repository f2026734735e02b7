// Segment ids as block ranges for the flash kernels: per 64-row chunk of q's and of k's segment ids
// their [min, max], and the rows of the other side the chunk can meet, computed by two small kernels
// per call (sorted ids, i.e. packed documents, give each chunk the rows of its documents by binary
// search, once for every block and head that reads it). A (query block, key tile) pair whose ranges do
// not meet shares no segment and is skipped whole; a pair inside one segment runs unmasked; only pairs
// across a document edge look at each id.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/cuda/cuda_inputs.h"
#include "runtime/tensor.h"

namespace ra {

constexpr int kSegmentChunkRows = 64;

// Fills args.q_segment_ranges, args.kv_segment_ranges, args.q_key_windows, args.kv_query_windows and
// args.segments_sorted when args has segment ids (nothing otherwise),
// from a call temporary queued on `stream` and released there when this object dies: keep it alive
// until the kernels that read them are queued. With segment ids it clears args.after_carry_writer: a
// kernel launched behind this one's small kernel could read the ranges before they are written.
class SegmentRanges {
 public:
  SegmentRanges(CudaAttentionArgs& args, cudaStream_t stream);

 private:
  Tensor ranges_;  // the call temporary (Tensor::scratch)
};

}  // namespace ra
