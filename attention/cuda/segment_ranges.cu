#include "attention/cuda/segment_ranges.h"

#include <climits>

#include "runtime/cuda_device.h"

namespace ra {
namespace {

// One warp per 64-row chunk: chunks [0, q_chunks) of q's ids, then those of k's, for batch blockIdx.y.
// Any row whose id is below the one before it (also across chunks) clears *sorted.
__global__ void segment_ranges_kernel(DeviceView4 q_ids, int q_len, int q_chunks, DeviceView4 kv_ids, int kv_len,
                                      int kv_chunks, int2* q_out, int2* kv_out, int* sorted) {
  const bool is_q = int(blockIdx.x) < q_chunks;
  const int chunk = is_q ? blockIdx.x : blockIdx.x - q_chunks, b = blockIdx.y, lane = threadIdx.x;
  const DeviceView4& ids = is_q ? q_ids : kv_ids;
  const int len = is_q ? q_len : kv_len;
  auto id_of = [&](int r) { return static_cast<const int32_t*>(ids.data)[b * ids.stride[0] + r * ids.stride[1]]; };
  int lo = INT_MAX, hi = INT_MIN;
  bool ascending = true;
  for (int r = chunk * kSegmentChunkRows + lane; r < min((chunk + 1) * kSegmentChunkRows, len); r += 32) {
    const int id = id_of(r);
    lo = min(lo, id), hi = max(hi, id);
    if (r > 0 && id_of(r - 1) > id) ascending = false;
  }
  for (int o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  if (!__all_sync(0xffffffffu, ascending) && lane == 0) atomicAnd(sorted, 0);
  if (lane == 0) (is_q ? q_out + b * q_chunks : kv_out + b * kv_chunks)[chunk] = make_int2(lo, hi);
}

int chunks_of(int rows) { return (rows + kSegmentChunkRows - 1) / kSegmentChunkRows; }

}  // namespace

SegmentRanges::SegmentRanges(CudaAttentionArgs& a, cudaStream_t stream) : stream_(stream) {
  if (!a.q_segment_ids.data || a.q_len == 0 || a.kv_len == 0) return;
  const int q_chunks = chunks_of(a.q_len), kv_chunks = chunks_of(a.kv_len);
  // The flag first (int2 alignment kept), then the ranges.
  ranges_ = cuda_allocate_temporary(sizeof(int2) * (1 + size_t(a.batch) * (q_chunks + kv_chunks)), stream,
                                    "the segment ids' block ranges");
  int* sorted = static_cast<int*>(ranges_);
  int2* q_out = static_cast<int2*>(ranges_) + 1;
  int2* kv_out = q_out + size_t(a.batch) * q_chunks;
  cudaError_t launched = cudaMemsetAsync(sorted, 1, sizeof(int), stream);  // 0x01010101: true until cleared
  if (launched == cudaSuccess) {
    segment_ranges_kernel<<<dim3(unsigned(q_chunks + kv_chunks), unsigned(a.batch)), 32, 0, stream>>>(
        a.q_segment_ids, a.q_len, q_chunks, a.kv_segment_ids, a.kv_len, kv_chunks, q_out, kv_out, sorted);
    launched = cudaGetLastError();
  }
  if (launched != cudaSuccess) {
    cuda_release_temporary(ranges_, stream);
    ranges_ = nullptr;
    RA_CUDA_CHECK(launched);
  }
  a.q_segment_ranges = q_out;
  a.kv_segment_ranges = kv_out;
  a.segment_ids_sorted = sorted;
  a.after_carry_writer = false;
}

SegmentRanges::~SegmentRanges() {
  if (ranges_) cuda_release_temporary(ranges_, stream_);
}

}  // namespace ra
