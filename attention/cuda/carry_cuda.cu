// Carry kernels: one warp per row (eight rows per block: a block per row left most of a launch to
// block scheduling, about 0.3 ms of a 3.4 ms flash call at T=8192), lanes striding over the features;
// every lane reads the row statistics and lane 0 writes them after the warp has read them.
#include "attention/cuda/carry_cuda.h"

#include "attention/cuda/device_math.cuh"
#include "attention/online_softmax.h"
#include "runtime/cuda_device.h"

namespace ra {
namespace {

constexpr int kRowsPerBlock = 8;
constexpr unsigned kCarryThreads = 32 * kRowsPerBlock;

// This warp's row among `rows`, or -1 past the end.
__device__ __forceinline__ int64_t warp_row(int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  return row < rows ? row : -1;
}

// Row r of `into` (B*Hq*T rows) merged with row `row` of `other`.
__global__ void merge_kernel(float* num, float* den, float* mx, const float* onum, const float* oden, const float* omx,
                             int64_t rows_into, int64_t rows_other, int64_t row_offset, int dv, int64_t count) {
  const int64_t row = warp_row(count);  // over (b*h, t) of other
  if (row < 0) return;
  const int lane = threadIdx.x % 32;
  const int64_t bh = row / rows_other, t = row % rows_other;
  const int64_t r = bh * rows_into + row_offset + t;
  SoftmaxState<float> state{mx[r], den[r]};
  const MergeScales<float> scales = softmax_merge(state, {omx[row], oden[row]});
  for (int d = lane; d < dv; d += 32) num[r * dv + d] = num[r * dv + d] * scales.self + onum[row * dv + d] * scales.other;
  __syncwarp();
  if (lane == 0) {
    den[r] = state.sum;
    mx[r] = state.max;
  }
}

__global__ void fold_kernel(float* num, float* den, float* mx, const void* o, DType o_dtype, const float* lse_block,
                            int64_t heads, int64_t rows, int64_t carry_rows, int64_t row_offset, int dv, int64_t count) {
  const int64_t block_row = warp_row(count);  // (b, h, t) of the block
  if (block_row < 0) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = block_row % rows, bh = block_row / rows, h = bh % heads, b = bh / heads;
  const int64_t row = bh * carry_rows + row_offset + t;
  // A finished block is the state (max = its LSE, sum = 1) with numerator O.
  SoftmaxState<float> state{mx[row], den[row]};
  const MergeScales<float> scales = softmax_merge(state, {lse_block[block_row], 1.0f});
  const int64_t o_row = ((b * rows + t) * heads + h) * dv;
  for (int d = lane; d < dv; d += 32)
    num[row * dv + d] = num[row * dv + d] * scales.self + load_as_f32(o, o_row + d, o_dtype) * scales.other;
  __syncwarp();
  if (lane == 0) {
    den[row] = state.sum;
    mx[row] = state.max;
  }
}

__global__ void finalize_kernel(const float* num, const float* den, const float* mx, const float* sinks,
                                int64_t sink_stride, void* o, DType o_dtype, float* lse, int64_t heads, int64_t rows,
                                int dv, int64_t count) {
  const int64_t row = warp_row(count);
  if (row < 0) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = row % rows, bh = row / rows, h = bh % heads, b = bh / heads;
  const Normalized<float> done = softmax_normalize(SoftmaxState<float>{mx[row], den[row]}, sinks != nullptr,
                                                    sinks != nullptr ? sinks[h * sink_stride] : 0.0f);
  const int64_t o_row = ((b * rows + t) * heads + h) * dv;
  for (int d = lane; d < dv; d += 32) store_from_f32(o, o_row + d, o_dtype, num[row * dv + d] * done.scale);
  if (lane == 0) lse[row] = done.lse;
}

__global__ void fill_kernel(float* p, int64_t n, float value) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

void fill_max(Carry& carry, cudaStream_t stream) {
  const int64_t n = carry.row_count();
  if (n > 0) fill_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(carry.max.data<float>(), n, -INFINITY);
  RA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void reset_carry_cuda(Carry& carry, cudaStream_t stream) {
  RA_CUDA_CHECK(cudaMemsetAsync(carry.numerator.data<float>(), 0, carry.numerator.view().nbytes(), stream));
  RA_CUDA_CHECK(cudaMemsetAsync(carry.denominator.data<float>(), 0, carry.denominator.view().nbytes(), stream));
  fill_max(carry, stream);
}

void fill_carry_max_cuda(Carry& carry, cudaStream_t stream) {
  fill_max(carry, stream);
  if (stream == nullptr) RA_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // non-blocking streams do not wait for it
}

void merge_carry_cuda(Carry& into, const Carry& other, int64_t row_offset, cudaStream_t stream) {
  RA_CHECK(into.batch == other.batch && into.heads == other.heads && into.value_dim == other.value_dim &&
               row_offset >= 0 && row_offset + other.rows <= into.rows,
           "carry merge: shapes differ (", into.numerator.shape().str(), " vs ", other.numerator.shape().str(),
           " at row ", row_offset, ")");
  if (other.row_count() == 0) return;
  merge_kernel<<<row_blocks(other.row_count()), kCarryThreads, 0, stream>>>(
      into.numerator.data<float>(), into.denominator.data<float>(), into.max.data<float>(),
      other.numerator.data<float>(), other.denominator.data<float>(), other.max.data<float>(), into.rows, other.rows,
      row_offset, int(into.value_dim), other.row_count());
  RA_CUDA_CHECK(cudaGetLastError());
}

void fold_output_lse_cuda(Carry& into, const TensorView& o, const TensorView& lse, int64_t row_offset,
                          cudaStream_t stream) {
  const int64_t rows = o.dim(1), block_rows = into.batch * into.heads * rows;
  RA_CHECK(o.is_contiguous() && o.dim(0) == into.batch && o.dim(2) == into.heads && o.dim(3) == into.value_dim &&
               row_offset >= 0 && row_offset + rows <= into.rows && lse.dtype() == DType::kF32 && lse.numel() == block_rows,
           "fold_output_lse: o ", o.shape().str(), " and lse ", lse.shape().str(), " at row ", row_offset,
           " do not match the carry ", into.numerator.shape().str());
  if (block_rows == 0) return;
  fold_kernel<<<row_blocks(block_rows), kCarryThreads, 0, stream>>>(
      into.numerator.data<float>(), into.denominator.data<float>(), into.max.data<float>(), o.data(), o.dtype(),
      lse.data_as<float>(), into.heads, rows, into.rows, row_offset, int(into.value_dim), block_rows);
  RA_CUDA_CHECK(cudaGetLastError());
}

void finalize_cuda(const Carry& carry, const TensorView& sinks, const TensorView& o, const TensorView& lse,
                   cudaStream_t stream) {
  const int64_t B = carry.batch, H = carry.heads, T = carry.rows, dv = carry.value_dim;
  RA_CHECK(o.rank() == 4 && o.dim(0) == B && o.dim(1) == T && o.dim(2) == H && o.dim(3) == dv && o.is_contiguous(),
           "output o has shape ", o.shape().str(), ", expected contiguous (", B, ", ", T, ", ", H, ", ", dv, ")");
  RA_CHECK(lse.dtype() == DType::kF32 && lse.numel() == B * H * T, "output lse must be f32 (", B, ", ", H, ", ", T, ")");
  RA_CHECK(o.memory() == MemoryKind::kCuda && lse.memory() == MemoryKind::kCuda &&
               (!sinks.defined() || sinks.memory() == MemoryKind::kCuda),
           "finalize on the device needs o, lse and sinks in device memory");
  if (carry.row_count() == 0) return;
  finalize_kernel<<<row_blocks(carry.row_count()), kCarryThreads, 0, stream>>>(
      carry.numerator.data<float>(), carry.denominator.data<float>(), carry.max.data<float>(),
      sinks.defined() ? sinks.data_as<float>() : nullptr, sinks.defined() ? sinks.stride(0) : 0, o.data(), o.dtype(),
      lse.data_as<float>(), H, T, int(dv), carry.row_count());
  RA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ra
