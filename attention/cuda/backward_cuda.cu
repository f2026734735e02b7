// Delta, the sinks' gradient and the gradients' dtype conversion on the device.
#include "attention/cuda/backward_cuda.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attention/cuda/device_math.cuh"
#include "attention/cuda/dispatch.cuh"
#include "attention/cuda/quad.cuh"
#include "runtime/cuda_device.h"
#include "runtime/graph_capture.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra {
namespace {

// delta of a row: its Dv products summed in quads (four elements), quad c on lane c % lanes of the row's lanes (a
// power of two), then across those lanes; a warp takes kRowsPerWarp groups of 32 / lanes consecutive rows of one
// (b, h), their loads issued together. The grid is (H, row blocks, B): no index is divided (a row's (b, h, t) from a
// flat index cost more instructions than its loads: 64-bit divisions), and blocks in launch order read the heads of
// the same rows, O's order in memory (bench/RESULTS.md, "Delta without divisions, in O's order"). kVector: each quad
// one load (contiguous, aligned rows); else element by element, in the same order of adds, so delta's bits do not
// depend on the tensors' strides (a ring's shards, a view). `zero` (rows (B, T, H, zero_width) of f32, contiguous,
// zero_width a multiple of 4; or null): zeros written over it beside the sums, where this kernel's loads leave DRAM's
// writes idle (the backward's dQ accumulator, which a memset of its own wrote at DRAM's rate).
constexpr int kRowsPerWarp = 4;
template <typename TO, typename TD, bool kVector>
__global__ void delta_kernel(const TO* o, DeviceStrides4 os, const TD* d_o, DeviceStrides4 ds, const float* d_lse,
                             float* delta, int64_t B, int64_t H, int64_t T, int64_t Dv, int lanes, float* zero,
                             int64_t zero_width) {
  const int lane = threadIdx.x % 32, part = lane % lanes, group = 32 / lanes;
  const int64_t h = blockIdx.x, rows_per_block = int64_t(blockDim.x / 32) * kRowsPerWarp * group;
  const int64_t warp_t = (threadIdx.x / 32) * kRowsPerWarp * group;  // this warp's first row in a block of rows
  // (B or T's row blocks past the grid's 65535: rare shapes, looped)
  for (int64_t b = blockIdx.z; b < B; b += gridDim.z)
    for (int64_t t0 = blockIdx.y * rows_per_block + warp_t; t0 < T; t0 += gridDim.y * rows_per_block) {
      const int64_t first = t0 + lane / lanes;  // this lane's row of the warp's first group
      const TO* o_rows = o + b * os.s[0] + h * os.s[2];
      const TD* do_rows = d_o + b * ds.s[0] + h * ds.s[2];
      const TO* o_row[kRowsPerWarp];
      const TD* do_row[kRowsPerWarp];
      float sum[kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int64_t t = min(first + i * group, T - 1);  // rows past the end read the last one, never stored
        o_row[i] = o_rows + t * os.s[1], do_row[i] = do_rows + t * ds.s[1], sum[i] = 0.0f;
      }
      for (int64_t c = part; 4 * c < Dv; c += lanes) {
        float4 x[kRowsPerWarp], y[kRowsPerWarp];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
          if constexpr (kVector) {
            x[i] = Quad<TO>::load(o_row[i] + 4 * c), y[i] = Quad<TD>::load(do_row[i] + 4 * c);
          } else {
            x[i] = quad_of_elements(o_row[i], 4 * c, os.s[3], Dv);
            y[i] = quad_of_elements(do_row[i], 4 * c, ds.s[3], Dv);
          }
        }
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i)
          sum[i] += x[i].x * y[i].x, sum[i] += x[i].y * y[i].y, sum[i] += x[i].z * y[i].z, sum[i] += x[i].w * y[i].w;
      }
      const int64_t head_row0 = (b * H + h) * T;  // (b, h)'s first row in delta and d_lse, both (B, H, T)
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        for (int offset = lanes / 2; offset > 0; offset >>= 1) sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], offset);
        const int64_t t = first + i * group;
        if (t < T && part == 0) delta[head_row0 + t] = d_lse != nullptr ? sum[i] - d_lse[head_row0 + t] : sum[i];
        if (zero != nullptr && t < T) {
          float* row = zero + ((b * T + t) * H + h) * zero_width;
          for (int64_t c = part; 4 * c < zero_width; c += lanes)
            Quad<float>::store(row + 4 * c, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        }
      }
    }
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
                        cudaStream_t stream, const TensorView& zero) {
  const int64_t B = o.dim(0), T = o.dim(1), H = o.dim(2), Dv = o.dim(3);
  if (zero.defined())
    RA_CHECK(zero.dtype() == DType::kF32 && zero.is_contiguous() && zero.rank() == 4 && zero.dim(0) == B &&
                 zero.dim(1) == T && zero.dim(2) == H && zero.dim(3) % 4 == 0 && aligned(zero.data(), 16),
             "delta's zero rows must be f32 (B, T, H, a multiple of 4), contiguous and 16-byte aligned");
  if (B * H * T == 0) return;
  with_float_type(o.dtype(), "delta's o", [&](auto* o_type) {
    with_float_type(d_o.dtype(), "delta's do", [&](auto* do_type) {
      using TO = std::remove_pointer_t<decltype(o_type)>;
      using TD = std::remove_pointer_t<decltype(do_type)>;
      int lanes = 1;
      while (lanes < 32 && 4 * lanes < Dv) lanes *= 2;
      auto rows_of_quads = [&](const TensorView& t, size_t element) {
        return t.stride(3) == 1 && Dv % 4 == 0 && t.stride(0) % 4 == 0 && t.stride(1) % 4 == 0 && t.stride(2) % 4 == 0 &&
               aligned(t.data(), 4 * element);
      };
      const bool vector = rows_of_quads(o, sizeof(TO)) && rows_of_quads(d_o, sizeof(TD));
      // Up to 8 warps a block, fewer where a (b, h) has fewer rows (T = 1 in decoding).
      const int64_t rows_per_warp = kRowsPerWarp * (32 / lanes);
      const int64_t warps = std::min<int64_t>(8, (T + rows_per_warp - 1) / rows_per_warp);
      const int64_t row_blocks = (T + warps * rows_per_warp - 1) / (warps * rows_per_warp);
      const dim3 grid(unsigned(H), unsigned(std::min<int64_t>(row_blocks, 65535)),
                      unsigned(std::min<int64_t>(B, 65535)));
      dispatch_bool(vector, [&](auto kVector) {
        delta_kernel<TO, TD, decltype(kVector)::value><<<grid, unsigned(32 * warps), 0, stream>>>(
            o.data_as<TO>(), strides_of(o), d_o.data_as<TD>(), strides_of(d_o),
            d_lse.defined() ? d_lse.data_as<float>() : nullptr, delta.data_as<float>(), B, H, T, Dv, lanes,
            zero.defined() ? zero.data_as<float>() : nullptr, zero.defined() ? zero.dim(3) : 0);
      });
    });
  });
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
