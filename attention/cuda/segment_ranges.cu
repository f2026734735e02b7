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

// For each chunk of either side (one thread each), the rows of the other side its ids can meet, as
// [first, end): with sorted ids two binary searches over the other side's chunk ranges (the chunks
// whose ids reach this chunk's smallest, up to those past its largest), else every row.
__global__ void segment_windows_kernel(const int2* q_ranges, int q_len, int q_chunks, const int2* kv_ranges,
                                       int kv_len, int kv_chunks, const int* sorted, int2* q_out, int2* kv_out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
  if (i >= q_chunks + kv_chunks) return;
  const bool is_q = i < q_chunks;
  const int2 mine = is_q ? q_ranges[b * q_chunks + i] : kv_ranges[b * kv_chunks + (i - q_chunks)];
  const int2* other = is_q ? kv_ranges + b * kv_chunks : q_ranges + b * q_chunks;
  const int other_chunks = is_q ? kv_chunks : q_chunks, other_len = is_q ? kv_len : q_len;
  int2 window = make_int2(0, other_len);
  if (*sorted) {
    int lo = 0, hi = other_chunks;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (other[mid].y >= mine.x) hi = mid;
      else lo = mid + 1;
    }
    window.x = lo * kSegmentChunkRows;
    lo = 0, hi = other_chunks;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (other[mid].x > mine.y) hi = mid;
      else lo = mid + 1;
    }
    window.y = min(other_len, lo * kSegmentChunkRows);
  }
  (is_q ? q_out + b * q_chunks + i : kv_out + b * kv_chunks + (i - q_chunks))[0] = window;
}

int chunks_of(int rows) { return (rows + kSegmentChunkRows - 1) / kSegmentChunkRows; }

}  // namespace

SegmentRanges::SegmentRanges(CudaAttentionArgs& a, cudaStream_t stream) {
  if (!a.q_segment_ids.data || a.q_len == 0 || a.kv_len == 0) return;
  const int q_chunks = chunks_of(a.q_len), kv_chunks = chunks_of(a.kv_len);
  // The flag first (int2 alignment kept), then the ranges and the windows of q's chunks and of k's.
  const size_t per_side = size_t(a.batch) * (q_chunks + kv_chunks);
  ranges_ = Tensor::scratch(sizeof(int2) * (1 + 2 * per_side), MemoryKind::kCuda, stream, "the segment ids' block ranges");
  int* sorted = ranges_.data<int>();
  int2* q_ranges = ranges_.data<int2>() + 1;
  int2* kv_ranges = q_ranges + size_t(a.batch) * q_chunks;
  int2* q_windows = kv_ranges + size_t(a.batch) * kv_chunks;
  int2* kv_windows = q_windows + size_t(a.batch) * q_chunks;
  cudaError_t launched = cudaMemsetAsync(sorted, 1, sizeof(int), stream);  // 0x01010101: true until cleared
  if (launched == cudaSuccess) {
    segment_ranges_kernel<<<dim3(unsigned(q_chunks + kv_chunks), unsigned(a.batch)), 32, 0, stream>>>(
        a.q_segment_ids, a.q_len, q_chunks, a.kv_segment_ids, a.kv_len, kv_chunks, q_ranges, kv_ranges, sorted);
    segment_windows_kernel<<<dim3(unsigned((q_chunks + kv_chunks + 127) / 128), unsigned(a.batch)), 128, 0, stream>>>(
        q_ranges, a.q_len, q_chunks, kv_ranges, a.kv_len, kv_chunks, sorted, q_windows, kv_windows);
    launched = cudaGetLastError();
  }
  RA_CUDA_CHECK(launched);
  a.q_segment_ranges = q_ranges;
  a.kv_segment_ranges = kv_ranges;
  a.q_key_windows = q_windows;
  a.kv_query_windows = kv_windows;
  a.segments_sorted = sorted;
  a.after_carry_writer = false;
}

}  // namespace ra
