// Carry kernels: one thread per (row, feature) for the numerator, the row statistics recomputed by
// each thread of the row (cheap, and no second pass or synchronisation is needed).
#include "attention/cuda/carry_cuda.h"

#include "attention/cuda/device_math.cuh"
#include "attention/online_softmax.h"
#include "runtime/cuda_device.h"

namespace ra {
namespace {

// Row r of `into` (B*Hq*T rows) merged with row o of `other`; the thread with d == 0 updates the stats
// after every thread of the row has read them (each row's threads sit in one block: Dv <= 1024).
__global__ void merge_kernel(float* num, float* den, float* mx, const float* onum, const float* oden, const float* omx,
                             int64_t rows_into, int64_t rows_other, int64_t row_offset, int dv) {
  const int64_t row = blockIdx.x;  // over (b*h, t) of other
  const int64_t bh = row / rows_other, t = row % rows_other;
  const int64_t r = bh * rows_into + row_offset + t;
  const float m_old = mx[r], m_other = omx[row];
  const float m = fmaxf(m_old, m_other);
  if (m == -INFINITY) return;
  const float a = rescale_factor(m_old, m), b = rescale_factor(m_other, m);
  for (int d = threadIdx.x; d < dv; d += blockDim.x) num[r * dv + d] = num[r * dv + d] * a + onum[row * dv + d] * b;
  __syncthreads();
  if (threadIdx.x == 0) {
    den[r] = den[r] * a + oden[row] * b;
    mx[r] = m;
  }
}

__global__ void fold_kernel(float* num, float* den, float* mx, const void* o, DType o_dtype, const float* lse_block,
                            int64_t heads, int64_t rows, int64_t carry_rows, int64_t row_offset, int dv) {
  const int64_t block_row = blockIdx.x;  // (b, h, t) of the block
  const int64_t t = block_row % rows, bh = block_row / rows, h = bh % heads, b = bh / heads;
  const int64_t row = bh * carry_rows + row_offset + t;
  const float m_old = mx[row], m_block = lse_block[block_row];
  const float m = fmaxf(m_old, m_block);
  if (m == -INFINITY) return;
  const float a = rescale_factor(m_old, m), c = rescale_factor(m_block, m);
  const int64_t o_row = ((b * rows + t) * heads + h) * dv;
  for (int d = threadIdx.x; d < dv; d += blockDim.x)
    num[row * dv + d] = num[row * dv + d] * a + load_as_f32(o, o_row + d, o_dtype) * c;
  __syncthreads();
  if (threadIdx.x == 0) {
    den[row] = den[row] * a + c;
    mx[row] = m;
  }
}

__global__ void finalize_kernel(const float* num, const float* den, const float* mx, const float* sinks,
                                int64_t sink_stride, void* o, DType o_dtype, float* lse, int64_t heads, int64_t rows,
                                int dv) {
  const int64_t row = blockIdx.x;
  const int64_t t = row % rows, bh = row / rows, h = bh % heads, b = bh / heads;
  float m = mx[row], l = den[row], scale_num = 1.0f;
  if (sinks != nullptr) {  // one extra logit with a zero value row, counted once here
    const float s = sinks[h * sink_stride];
    const float m2 = fmaxf(m, s);
    scale_num = rescale_factor(m, m2);
    l = l * scale_num + expf(s - m2);
    m = m2;
  }
  const float inv = l > 0.0f ? scale_num / l : 0.0f;
  const int64_t o_row = ((b * rows + t) * heads + h) * dv;
  for (int d = threadIdx.x; d < dv; d += blockDim.x) store_from_f32(o, o_row + d, o_dtype, num[row * dv + d] * inv);
  if (threadIdx.x == 0) lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
}

__global__ void fill_kernel(float* p, int64_t n, float value) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

unsigned row_threads(int64_t dv) { return unsigned(dv >= 128 ? 128 : (dv + 31) / 32 * 32); }

}  // namespace

void reset_carry_cuda(Carry& carry, cudaStream_t stream) {
  RA_CUDA_CHECK(cudaMemsetAsync(carry.numerator.data<float>(), 0, carry.numerator.view().nbytes(), stream));
  RA_CUDA_CHECK(cudaMemsetAsync(carry.denominator.data<float>(), 0, carry.denominator.view().nbytes(), stream));
  const int64_t n = carry.row_count();
  if (n > 0) fill_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(carry.max.data<float>(), n, -INFINITY);
  RA_CUDA_CHECK(cudaGetLastError());
}

void merge_carry_cuda(Carry& into, const Carry& other, int64_t row_offset, cudaStream_t stream) {
  RA_CHECK(into.batch == other.batch && into.heads == other.heads && into.value_dim == other.value_dim &&
               row_offset >= 0 && row_offset + other.rows <= into.rows,
           "carry merge: shapes differ (", into.numerator.shape().str(), " vs ", other.numerator.shape().str(),
           " at row ", row_offset, ")");
  if (other.row_count() == 0) return;
  merge_kernel<<<unsigned(other.row_count()), row_threads(into.value_dim), 0, stream>>>(
      into.numerator.data<float>(), into.denominator.data<float>(), into.max.data<float>(),
      other.numerator.data<float>(), other.denominator.data<float>(), other.max.data<float>(), into.rows, other.rows,
      row_offset, int(into.value_dim));
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
  fold_kernel<<<unsigned(block_rows), row_threads(into.value_dim), 0, stream>>>(
      into.numerator.data<float>(), into.denominator.data<float>(), into.max.data<float>(), o.data(), o.dtype(),
      lse.data_as<float>(), into.heads, rows, into.rows, row_offset, int(into.value_dim));
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
  finalize_kernel<<<unsigned(carry.row_count()), row_threads(dv), 0, stream>>>(
      carry.numerator.data<float>(), carry.denominator.data<float>(), carry.max.data<float>(),
      sinks.defined() ? sinks.data_as<float>() : nullptr, sinks.defined() ? sinks.stride(0) : 0, o.data(), o.dtype(),
      lse.data_as<float>(), H, T, int(dv));
  RA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ra
