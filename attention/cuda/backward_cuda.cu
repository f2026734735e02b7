// Delta, the sinks' gradient and the gradients' dtype conversion: one warp per row, as the carry kernels.
#include "attention/cuda/backward_cuda.h"

#include "attention/cuda/device_math.cuh"
#include "runtime/cuda_device.h"
#include "runtime/error.h"

namespace ra {
namespace {

constexpr int kRowsPerBlock = 8;

__global__ void delta_kernel(const void* o, DType o_dtype, DeviceStrides4 os, const void* d_o, DType do_dtype,
                             DeviceStrides4 ds, float* delta, int64_t T, int64_t H, int64_t Dv, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;  // (b, h, t)
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = row % T, h = (row / T) % H, b = row / (T * H);
  float sum = 0.0f;
  for (int64_t d = lane; d < Dv; d += 32)
    sum += load_as_f32(o, b * os.s[0] + t * os.s[1] + h * os.s[2] + d * os.s[3], o_dtype) *
           load_as_f32(d_o, b * ds.s[0] + t * ds.s[1] + h * ds.s[2] + d * ds.s[3], do_dtype);
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) delta[row] = sum;
}

// One block per head: a block-wide sum over (b, t).
__global__ void sinks_kernel(const float* sinks, int64_t sink_stride, const float* lse, const float* delta, float* out,
                             int64_t B, int64_t H, int64_t T) {
  const int64_t h = blockIdx.x;
  const float sink = sinks[h * sink_stride];
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < B * T; i += blockDim.x) {
    const int64_t b = i / T, t = i % T, r = (b * H + h) * T + t;
    if (lse[r] != -INFINITY) sum -= expf(sink - lse[r]) * delta[r];
  }
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) total += partial[w];
    out[h] = total;
  }
}

__global__ void convert_kernel(const float* in, void* out, DType dtype, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) store_from_f32(out, i, dtype, in[i]);
}

__global__ void add_rows_kernel(float* into, DeviceStrides4 is, const void* from, DType dtype, int64_t L, int64_t H,
                                int64_t X, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t x = i % X, h = (i / X) % H, l = (i / (X * H)) % L, b = i / (X * H * L);
  into[b * is.s[0] + l * is.s[1] + h * is.s[2] + x * is.s[3]] += load_as_f32(from, i, dtype);
}

__global__ void positive_infinity_kernel(const float* in, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] == -INFINITY ? INFINITY : in[i];
}

DeviceStrides4 strides_of(const TensorView& t) {
  DeviceStrides4 s;
  for (int i = 0; i < 4; ++i) s.s[i] = t.stride(i);
  return s;
}

}  // namespace

void compute_delta_cuda(const TensorView& o, const TensorView& d_o, const TensorView& delta, cudaStream_t stream) {
  const int64_t B = o.dim(0), T = o.dim(1), H = o.dim(2), Dv = o.dim(3), rows = B * H * T;
  if (rows == 0) return;
  delta_kernel<<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(
      o.data(), o.dtype(), strides_of(o), d_o.data(), d_o.dtype(), strides_of(d_o), delta.data_as<float>(), T, H, Dv,
      rows);
  RA_CUDA_CHECK(cudaGetLastError());
}

void sinks_gradient_cuda(const TensorView& sinks, const TensorView& lse, const TensorView& delta,
                         const TensorView& dsinks, cudaStream_t stream) {
  const int64_t B = lse.dim(0), H = lse.dim(1), T = lse.dim(2);
  RA_CHECK(sinks.memory() == MemoryKind::kCuda, "sinks must be in device memory for the cuda backward");
  if (H == 0) return;
  sinks_kernel<<<unsigned(H), 256, 0, stream>>>(sinks.data_as<float>(), sinks.stride(0), lse.data_as<float>(),
                                                delta.data_as<float>(), dsinks.data_as<float>(), B, H, T);
  RA_CUDA_CHECK(cudaGetLastError());
}

void convert_f32_cuda(const TensorView& in, const TensorView& out, cudaStream_t stream) {
  const int64_t n = in.numel();
  if (n == 0) return;
  convert_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(in.data_as<float>(), out.data(), out.dtype(), n);
  RA_CUDA_CHECK(cudaGetLastError());
}

void add_rows_cuda(const TensorView& into, const TensorView& from, cudaStream_t stream) {
  const int64_t n = from.numel();
  if (n == 0) return;
  add_rows_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(into.data_as<float>(), strides_of(into), from.data(),
                                                          from.dtype(), from.dim(1), from.dim(2), from.dim(3), n);
  RA_CUDA_CHECK(cudaGetLastError());
}

Tensor finite_or_positive_infinity(const TensorView& lse, cudaStream_t stream) {
  Tensor out(DType::kF32, lse.shape(), MemoryKind::kCuda);
  const int64_t n = lse.numel();
  if (n > 0) positive_infinity_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(lse.data_as<float>(), out.data<float>(), n);
  RA_CUDA_CHECK(cudaGetLastError());
  return out;
}

}  // namespace ra
