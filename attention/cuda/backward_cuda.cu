// Delta, the sinks' gradient and the gradients' dtype conversion: one warp per row, as the carry kernels.
#include "attention/cuda/backward_cuda.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attention/cuda/device_math.cuh"
#include "runtime/cuda_device.h"
#include "runtime/graph_capture.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra {
namespace {

constexpr int kRowsPerBlock = 8;

__global__ void delta_kernel(const void* o, DType o_dtype, DeviceStrides4 os, const void* d_o, DType do_dtype,
                             DeviceStrides4 ds, const float* d_lse, float* delta, int64_t T, int64_t H, int64_t Dv,
                             int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;  // (b, h, t)
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = row % T, h = (row / T) % H, b = row / (T * H);
  float sum = 0.0f;
  for (int64_t d = lane; d < Dv; d += 32)
    sum += load_as_f32(o, b * os.s[0] + t * os.s[1] + h * os.s[2] + d * os.s[3], o_dtype) *
           load_as_f32(d_o, b * ds.s[0] + t * ds.s[1] + h * ds.s[2] + d * ds.s[3], do_dtype);
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) delta[row] = d_lse != nullptr ? sum - d_lse[row] : sum;  // d_lse: (B, H, T) as delta
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

// How the row kernels put a value into the f32 rows: added, added by atomics (other streams may add into the
// same rows meanwhile), or written over (rows nothing was added to yet: no read).
enum class RowsOp : int { kAdd, kAtomicAdd, kWrite };

__global__ void add_rows_kernel(float* into, DeviceStrides4 is, const void* from, DType dtype, int64_t L, int64_t H,
                                int64_t X, int64_t n, RowsOp op) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t x = i % X, h = (i / X) % H, l = (i / (X * H)) % L, b = i / (X * H * L);
  float* to = into + b * is.s[0] + l * is.s[1] + h * is.s[2] + x * is.s[3];
  const float value = load_as_f32(from, i, dtype);
  if (op == RowsOp::kAtomicAdd) atomicAdd(to, value);
  else if (op == RowsOp::kAdd) *to += value;
  else *to = value;
}

// Four consecutive elements as f32, and back: the vectorised kernels below move 16-byte (f32) or
// 8-byte (16-bit) words, which the scalar kernels above, at a quarter of HBM's rate, did not.
template <typename T>
struct Quad;
template <>
struct Quad<float> {
  static __device__ __forceinline__ float4 load(const float* p) { return *reinterpret_cast<const float4*>(p); }
  static __device__ __forceinline__ void store(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
};
template <typename T2, typename T, T2 (*pack)(float2), float2 (*unpack)(T2)>
struct Quad16 {
  static __device__ __forceinline__ float4 load(const T* p) {
    const uint2 word = *reinterpret_cast<const uint2*>(p);
    const float2 lo = unpack(*reinterpret_cast<const T2*>(&word.x)), hi = unpack(*reinterpret_cast<const T2*>(&word.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  static __device__ __forceinline__ void store(T* p, float4 v) {
    const T2 lo = pack(make_float2(v.x, v.y)), hi = pack(make_float2(v.z, v.w));
    *reinterpret_cast<uint2*>(p) =
        make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
  }
};
__device__ __forceinline__ __nv_bfloat162 pack_bf16(float2 v) { return __float22bfloat162_rn(v); }
__device__ __forceinline__ float2 unpack_bf16(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ __half2 pack_f16(float2 v) { return __float22half2_rn(v); }
__device__ __forceinline__ float2 unpack_f16(__half2 v) { return __half22float2(v); }
template <>
struct Quad<__nv_bfloat16> : Quad16<__nv_bfloat162, __nv_bfloat16, pack_bf16, unpack_bf16> {};
template <>
struct Quad<__half> : Quad16<__half2, __half, pack_f16, unpack_f16> {};

template <typename T>
__global__ void convert_quad_kernel(const float* in, T* out, int64_t quads) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < quads; i += int64_t(gridDim.x) * blockDim.x)
    Quad<T>::store(out + 4 * i, Quad<float>::load(in + 4 * i));
}

// into's rows (b, l, h) are X contiguous floats at strides that are multiples of 4; from is contiguous.
// kAtomicAdd: 16-byte atomics from sm_90, else 4-byte.
template <typename T, typename Index, RowsOp kOp>
__global__ void add_rows_quad_kernel(float* into, DeviceStrides4 is, const T* from, Index L, Index H, Index X4,
                                     Index quads) {
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < quads; i += Index(gridDim.x) * blockDim.x) {
    const Index x4 = i % X4, row = i / X4, h = row % H, l = (row / H) % L, b = row / (H * L);
    float* to = into + int64_t(b) * is.s[0] + int64_t(l) * is.s[1] + int64_t(h) * is.s[2] + 4 * int64_t(x4);
    const float4 d = Quad<T>::load(from + 4 * int64_t(i));
    if constexpr (kOp == RowsOp::kWrite) {
      Quad<float>::store(to, d);
    } else if constexpr (kOp == RowsOp::kAtomicAdd) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float4*>(to), d);
#else
      atomicAdd(to, d.x), atomicAdd(to + 1, d.y), atomicAdd(to + 2, d.z), atomicAdd(to + 3, d.w);
#endif
    } else {
      const float4 a = Quad<float>::load(to);
      Quad<float>::store(to, make_float4(a.x + d.x, a.y + d.y, a.z + d.z, a.w + d.w));
    }
  }
}

template <typename A, typename O>
__global__ void add_convert_quad_kernel(const float* sum, const A* addend, O* out, int64_t quads) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < quads; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 s = Quad<float>::load(sum + 4 * i), a = Quad<A>::load(addend + 4 * i);
    Quad<O>::store(out + 4 * i, make_float4(s.x + a.x, s.y + a.y, s.z + a.z, s.w + a.w));
  }
}

// Calls f with a null pointer of the element type of f32, bf16 and f16 (true), else nothing (false).
template <typename F>
bool with_quad_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: f(static_cast<float*>(nullptr)); return true;
    case DType::kBF16: f(static_cast<__nv_bfloat16*>(nullptr)); return true;
    case DType::kF16: f(static_cast<__half*>(nullptr)); return true;
    default: return false;
  }
}

__global__ void add_slices_kernel(float* into, const float* slices, int count, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 4; i += int64_t(gridDim.x) * blockDim.x) {
    float4 sum = Quad<float>::load(into + 4 * i);
    for (int s = 0; s < count; ++s) {
      const float4 x = Quad<float>::load(slices + s * n + 4 * i);
      sum = make_float4(sum.x + x.x, sum.y + x.y, sum.z + x.z, sum.w + x.w);
    }
    Quad<float>::store(into + 4 * i, sum);
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Blocks for a grid-stride loop over `n` items: at most 16 per SM of a 132-SM Hopper, which keeps every SM
// busy without a block per item.
unsigned grid_for(int64_t n, unsigned threads) { return unsigned(std::min<int64_t>(blocks_for(n, threads), 132 * 16)); }

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

void compute_delta_cuda(const TensorView& o, const TensorView& d_o, const TensorView& d_lse, const TensorView& delta,
                        cudaStream_t stream) {
  const int64_t B = o.dim(0), T = o.dim(1), H = o.dim(2), Dv = o.dim(3), rows = B * H * T;
  if (rows == 0) return;
  delta_kernel<<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(
      o.data(), o.dtype(), strides_of(o), d_o.data(), d_o.dtype(), strides_of(d_o),
      d_lse.defined() ? d_lse.data_as<float>() : nullptr, delta.data_as<float>(), T, H, Dv, rows);
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
  bool quads = false;
  if (n % 4 == 0 && aligned(in.data(), 16) && aligned(out.data(), 4 * dtype_size(out.dtype())))
    quads = with_quad_type(out.dtype(), [&](auto* o) {
      using O = std::remove_pointer_t<decltype(o)>;
      convert_quad_kernel<<<grid_for(n / 4, 256), 256, 0, stream>>>(in.data_as<float>(), out.data_as<O>(), n / 4);
    });
  if (!quads) convert_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(in.data_as<float>(), out.data(), out.dtype(), n);
  RA_CUDA_CHECK(cudaGetLastError());
}

namespace {

template <typename T, RowsOp kOp>
void add_rows_quads(const TensorView& into, const TensorView& from, cudaStream_t stream) {
  const int64_t L = from.dim(1), H = from.dim(2), X4 = from.dim(3) / 4, quads = from.numel() / 4;
  const unsigned blocks = grid_for(quads, 256);
  float* to = into.data_as<float>();
  const T* add = from.data_as<T>();
  if (quads < (int64_t(1) << 31))  // 32-bit index arithmetic where it fits: the divisions are most of the work
    add_rows_quad_kernel<T, int32_t, kOp><<<blocks, 256, 0, stream>>>(to, strides_of(into), add, int32_t(L),
                                                                      int32_t(H), int32_t(X4), int32_t(quads));
  else
    add_rows_quad_kernel<T, int64_t, kOp><<<blocks, 256, 0, stream>>>(to, strides_of(into), add, L, H, X4, quads);
}

void put_rows(const TensorView& into, const TensorView& from, cudaStream_t stream, RowsOp op) {
  const int64_t n = from.numel();
  if (n == 0) return;
  bool quads = false;
  if (from.dim(3) % 4 == 0 && into.stride(3) == 1 && into.stride(0) % 4 == 0 && into.stride(1) % 4 == 0 &&
      into.stride(2) % 4 == 0 && aligned(into.data(), 16) && aligned(from.data(), 4 * dtype_size(from.dtype())))
    quads = with_quad_type(from.dtype(), [&](auto* f) {
      using T = std::remove_pointer_t<decltype(f)>;
      if (op == RowsOp::kAtomicAdd) add_rows_quads<T, RowsOp::kAtomicAdd>(into, from, stream);
      else if (op == RowsOp::kAdd) add_rows_quads<T, RowsOp::kAdd>(into, from, stream);
      else add_rows_quads<T, RowsOp::kWrite>(into, from, stream);
    });
  if (!quads)
    add_rows_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(into.data_as<float>(), strides_of(into), from.data(),
                                                            from.dtype(), from.dim(1), from.dim(2), from.dim(3), n, op);
  RA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void add_rows_cuda(const TensorView& into, const TensorView& from, cudaStream_t stream, bool atomic) {
  put_rows(into, from, stream, atomic ? RowsOp::kAtomicAdd : RowsOp::kAdd);
}

void write_rows_cuda(const TensorView& into, const TensorView& from, cudaStream_t stream) {
  put_rows(into, from, stream, RowsOp::kWrite);
}

void zero_rows_cuda(const TensorView& into, cudaStream_t stream) {
  const int64_t B = into.dim(0), L = into.dim(1), H = into.dim(2), X = into.dim(3);
  if (into.numel() == 0) return;
  RA_CHECK(into.dtype() == DType::kF32 && into.stride(3) == 1 && into.stride(2) == X && into.stride(1) == H * X,
           "zero_rows_cuda takes f32 rows of H x X contiguous floats; got shape ", into.shape().str());
  RA_CUDA_CHECK(cudaMemset2DAsync(into.data(), size_t(into.stride(0)) * sizeof(float), 0,
                                  size_t(L * H * X) * sizeof(float), size_t(B), stream));
}

void add_convert_cuda(const TensorView& sum, const TensorView& addend, const TensorView& out, cudaStream_t stream) {
  const int64_t n = sum.numel();
  RA_CHECK(addend.numel() == n && out.numel() == n && sum.is_contiguous() && addend.is_contiguous() &&
               out.is_contiguous(), "add_convert_cuda: sum ", sum.shape().str(), ", addend ", addend.shape().str(),
           " and out ", out.shape().str(), " must be contiguous with one element count");
  if (n == 0) return;
  const bool quads = n % 4 == 0 && aligned(sum.data(), 16) && aligned(addend.data(), 4 * dtype_size(addend.dtype())) &&
                     aligned(out.data(), 4 * dtype_size(out.dtype()));
  bool fused = false;
  if (quads) with_quad_type(addend.dtype(), [&](auto* a) {
    fused = with_quad_type(out.dtype(), [&](auto* o) {
      using A = std::remove_pointer_t<decltype(a)>;
      using O = std::remove_pointer_t<decltype(o)>;
      add_convert_quad_kernel<A, O><<<grid_for(n / 4, 256), 256, 0, stream>>>(
          sum.data_as<float>(), addend.data_as<A>(), out.data_as<O>(), n / 4);
    });
  });
  if (!fused) {
    auto flat = [n](const TensorView& t) { return TensorView(t.data(), t.dtype(), Shape{1, 1, 1, n}, t.memory()); };
    add_rows_cuda(flat(sum), flat(addend), stream);
    convert_f32_cuda(sum, out, stream);
  }
  RA_CUDA_CHECK(cudaGetLastError());
}

void add_slices_cuda(float* into, const float* slices, int count, int64_t n, cudaStream_t stream) {
  RA_CHECK(n % 4 == 0 && aligned(into, 16) && aligned(slices, 16), "add_slices_cuda takes 16-byte aligned rows of "
           "4 floats (", n, " floats given)");
  if (n == 0 || count == 0) return;
  add_slices_kernel<<<grid_for(n / 4, 256), 256, 0, stream>>>(into, slices, count, n);
  RA_CUDA_CHECK(cudaGetLastError());
}

TensorView finite_or_positive_infinity(const TensorView& lse, Tensor& scratch, cudaStream_t stream) {
  const int64_t n = lse.numel();
  float* into = call_scratch(scratch, size_t(n) * sizeof(float), stream, "the backward's LSE with +inf for empty rows")
                    .data_as<float>();
  const TensorView out(into, DType::kF32, lse.shape(), MemoryKind::kCuda);
  if (n > 0)
    positive_infinity_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(lse.data_as<float>(), out.data_as<float>(), n);
  RA_CUDA_CHECK(cudaGetLastError());
  return out;
}

}  // namespace ra
