// Carry kernels: one warp per row (eight rows per block: a block per row left most of a launch to
// block scheduling, about 0.3 ms of a 3.4 ms flash call at T=8192), lanes striding over the features (four at a
// time where rows allow); every lane reads the row statistics and lane 0 writes them after the warp has read them.
#include "attention/cuda/carry_cuda.h"

#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "attention/cuda/device_math.cuh"
#include "attention/cuda/dispatch.cuh"
#include "attention/cuda/quad.cuh"
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

// A row's dv features, lanes striding over quads where kQuads (dv % 4 == 0 and every row 16-byte aligned: the
// launch's check), else over single features: f(d) moves features d .. d + 3 (load_features, store_features: x
// alone where not kQuads), the same arithmetic per feature either way.
template <bool kQuads, typename F>
__device__ __forceinline__ void for_features(int dv, F&& f) {
  const int lane = threadIdx.x % 32;
  if constexpr (kQuads) {
    for (int d = 4 * lane; d < dv; d += 4 * 32) f(d);
  } else {
    for (int d = lane; d < dv; d += 32) f(d);
  }
}
template <typename T, bool kQuads>
__device__ __forceinline__ float4 load_features(const T* p) {
  if constexpr (kQuads) return Quad<T>::load(p);
  else return make_float4(element_f32(*p), 0.0f, 0.0f, 0.0f);
}
template <typename T, bool kQuads>
__device__ __forceinline__ void store_features(T* p, float4 v) {
  if constexpr (kQuads) Quad<T>::store(p, v);
  else store_element(p, v.x);
}
__device__ __forceinline__ float4 scaled_sum(float4 a, float sa, float4 b, float sb) {
  return make_float4(a.x * sa + b.x * sb, a.y * sa + b.y * sb, a.z * sa + b.z * sb, a.w * sa + b.w * sb);
}
__device__ __forceinline__ float4 scaled(float4 a, float s) { return make_float4(a.x * s, a.y * s, a.z * s, a.w * s); }

// Row r of `into` (B*Hq*T rows) merged with row `row` of `other`.
template <bool kQuads>
__global__ void merge_kernel(float* num, float* den, float* mx, const float* onum, const float* oden, const float* omx,
                             int64_t rows_into, int64_t rows_other, int64_t row_offset, int dv, int64_t count) {
  const int64_t row = warp_row(count);  // over (b*h, t) of other
  if (row < 0) return;
  const int64_t bh = row / rows_other, t = row % rows_other;
  const int64_t r = bh * rows_into + row_offset + t;
  SoftmaxState<float> state{mx[r], den[r]};
  const MergeScales<float> scales = softmax_merge(state, {omx[row], oden[row]});
  for_features<kQuads>(dv, [&](int d) {
    float* to = num + r * dv + d;
    store_features<float, kQuads>(to, scaled_sum(load_features<float, kQuads>(to), scales.self,
                                                 load_features<float, kQuads>(onum + row * dv + d), scales.other));
  });
  __syncwarp();
  if (threadIdx.x % 32 == 0) {
    den[r] = state.sum;
    mx[r] = state.max;
  }
}

template <typename T, bool kQuads>
__global__ void fold_kernel(float* num, float* den, float* mx, const T* o, const float* lse_block, int64_t heads,
                            int64_t rows, int64_t carry_rows, int64_t row_offset, int dv, int64_t count) {
  const int64_t block_row = warp_row(count);  // (b, h, t) of the block
  if (block_row < 0) return;
  const int64_t t = block_row % rows, bh = block_row / rows, h = bh % heads, b = bh / heads;
  const int64_t row = bh * carry_rows + row_offset + t;
  // A finished block is the state (max = its LSE, sum = 1) with numerator O.
  SoftmaxState<float> state{mx[row], den[row]};
  const MergeScales<float> scales = softmax_merge(state, {lse_block[block_row], 1.0f});
  const int64_t o_row = ((b * rows + t) * heads + h) * dv;
  for_features<kQuads>(dv, [&](int d) {
    float* to = num + row * dv + d;
    store_features<float, kQuads>(to, scaled_sum(load_features<float, kQuads>(to), scales.self,
                                                 load_features<T, kQuads>(o + o_row + d), scales.other));
  });
  __syncwarp();
  if (threadIdx.x % 32 == 0) {
    den[row] = state.sum;
    mx[row] = state.max;
  }
}

template <typename T, bool kQuads>
__global__ void finalize_kernel(const float* num, const float* den, const float* mx, const float* sinks,
                                int64_t sink_stride, T* o, float* lse, int64_t heads, int64_t rows, int dv, int64_t count) {
  const int64_t row = warp_row(count);
  if (row < 0) return;
  const int64_t t = row % rows, bh = row / rows, h = bh % heads, b = bh / heads;
  const Normalized<float> done = softmax_normalize(SoftmaxState<float>{mx[row], den[row]}, sinks != nullptr,
                                                    sinks != nullptr ? sinks[h * sink_stride] : 0.0f);
  const int64_t o_row = ((b * rows + t) * heads + h) * dv;
  for_features<kQuads>(dv, [&](int d) {
    store_features<T, kQuads>(o + o_row + d, scaled(load_features<float, kQuads>(num + row * dv + d), done.scale));
  });
  if (threadIdx.x % 32 == 0) lse[row] = done.lse;
}

// Rows of dv features that the kernels above take as quads: dv % 4 == 0 and each pointer 16-byte (f32) or 4-element
// aligned.
bool quad_rows(int64_t dv, std::initializer_list<std::pair<const void*, size_t>> bases) {
  bool quads = dv % 4 == 0;
  for (const auto& [p, element] : bases) quads = quads && aligned(p, 4 * element);
  return quads;
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
  const bool quads = quad_rows(into.value_dim, {{into.numerator.data<float>(), 4}, {other.numerator.data<float>(), 4}});
  dispatch_bool(quads, [&](auto kQuads) {
    merge_kernel<kQuads.value><<<row_blocks(other.row_count()), kCarryThreads, 0, stream>>>(
        into.numerator.data<float>(), into.denominator.data<float>(), into.max.data<float>(),
        other.numerator.data<float>(), other.denominator.data<float>(), other.max.data<float>(), into.rows, other.rows,
        row_offset, int(into.value_dim), other.row_count());
  });
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
  with_float_type(o.dtype(), "the carry's fold of o", [&](auto* element) {
    using T = std::remove_pointer_t<decltype(element)>;
    const bool quads = quad_rows(into.value_dim, {{into.numerator.data<float>(), 4}, {o.data(), sizeof(T)}});
    dispatch_bool(quads, [&](auto kQuads) {
      fold_kernel<T, kQuads.value><<<row_blocks(block_rows), kCarryThreads, 0, stream>>>(
          into.numerator.data<float>(), into.denominator.data<float>(), into.max.data<float>(), o.data_as<T>(),
          lse.data_as<float>(), into.heads, rows, into.rows, row_offset, int(into.value_dim), block_rows);
    });
  });
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
  with_float_type(o.dtype(), "the carry's output o", [&](auto* element) {
    using O = std::remove_pointer_t<decltype(element)>;
    const bool quads = quad_rows(dv, {{carry.numerator.data<float>(), 4}, {o.data(), sizeof(O)}});
    dispatch_bool(quads, [&](auto kQuads) {
      finalize_kernel<O, kQuads.value><<<row_blocks(carry.row_count()), kCarryThreads, 0, stream>>>(
          carry.numerator.data<float>(), carry.denominator.data<float>(), carry.max.data<float>(),
          sinks.defined() ? sinks.data_as<float>() : nullptr, sinks.defined() ? sinks.stride(0) : 0, o.data_as<O>(),
          lse.data_as<float>(), H, T, int(dv), carry.row_count());
    });
  });
  RA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ra
