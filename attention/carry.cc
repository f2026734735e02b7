// Carry creation, the pairwise merge and finalize (with attention sinks).
#include "attention/carry.h"

#include <cmath>

#include "attention/online_softmax.h"
#include "runtime/error.h"
#include "runtime/memory.h"

#if RA_HAVE_CUDA
#include "attention/cuda/carry_cuda.h"
#endif

namespace ra {

namespace {

// A carry whose tensors `make` allocates zeroed (shape, memory), the max then set to -inf.
template <typename Make>
Carry empty_carry(int64_t batch, int64_t heads, int64_t rows, int64_t value_dim, MemoryKind memory, void* cuda_stream,
                  Make make) {
  Carry c;
  c.batch = batch;
  c.heads = heads;
  c.rows = rows;
  c.value_dim = value_dim;
  c.numerator = make(Shape{batch, heads, rows, value_dim});
  c.denominator = make(Shape{batch, heads, rows});
  c.max = make(Shape{batch, heads, rows});
  if (memory == MemoryKind::kCuda) {  // a kernel: fill_f32 would stage -inf through pageable host memory
#if RA_HAVE_CUDA
    fill_carry_max_cuda(c, static_cast<cudaStream_t>(cuda_stream));
#endif
    return c;
  }
  fill_f32(c.max.view(), -INFINITY);
  return c;
}

}  // namespace

Carry Carry::empty(int64_t batch, int64_t heads, int64_t rows, int64_t value_dim, MemoryKind memory,
                   void* cuda_stream) {
  return empty_carry(batch, heads, rows, value_dim, memory, cuda_stream,
                     [&](const Shape& shape) { return Tensor(DType::kF32, shape, memory); });
}

Carry Carry::temporary(int64_t batch, int64_t heads, int64_t rows, int64_t value_dim, MemoryKind memory,
                       void* cuda_stream) {
  return empty_carry(batch, heads, rows, value_dim, memory, cuda_stream,
                     [&](const Shape& shape) { return Tensor::temporary(DType::kF32, shape, memory, cuda_stream); });
}

void reset(Carry& carry, void* cuda_stream) {
  if (carry.memory() == MemoryKind::kCuda) {
#if RA_HAVE_CUDA
    reset_carry_cuda(carry, static_cast<cudaStream_t>(cuda_stream));
#endif
    return;
  }
  fill_f32(carry.numerator.view(), 0.0f);
  fill_f32(carry.denominator.view(), 0.0f);
  fill_f32(carry.max.view(), -INFINITY);
}

void merge(Carry& into, const Carry& other, int64_t row_offset, void* cuda_stream) {
  RA_CHECK(into.batch == other.batch && into.heads == other.heads && into.value_dim == other.value_dim &&
               row_offset >= 0 && row_offset + other.rows <= into.rows,
           "carry merge: shapes differ (", into.numerator.shape().str(), " vs ", other.numerator.shape().str(),
           " at row ", row_offset, ")");
  RA_CHECK(into.memory() == other.memory(), "carry merge: one carry is on the host, the other on the device");
  if (into.memory() == MemoryKind::kCuda) {
#if RA_HAVE_CUDA
    merge_carry_cuda(into, other, row_offset, static_cast<cudaStream_t>(cuda_stream));
#endif
    return;
  }
  const int64_t dv = into.value_dim;
  float* num = into.numerator.data<float>();
  float* den = into.denominator.data<float>();
  float* mx = into.max.data<float>();
  const float* onum = other.numerator.data<float>();
  const float* oden = other.denominator.data<float>();
  const float* omx = other.max.data<float>();
  for (int64_t bh = 0; bh < into.batch * into.heads; ++bh)
    for (int64_t t = 0; t < other.rows; ++t) {
      int64_t r = bh * into.rows + row_offset + t, o = bh * other.rows + t;
      SoftmaxState<float> state{mx[r], den[r]};
      const auto [a, b] = softmax_merge(state, {omx[o], oden[o]});
      for (int64_t d = 0; d < dv; ++d) num[r * dv + d] = num[r * dv + d] * a + onum[o * dv + d] * b;
      mx[r] = state.max;
      den[r] = state.sum;
    }
}

void finalize(const Carry& carry, const TensorView& sinks, const TensorView& o, const TensorView& lse,
              void* cuda_stream) {
  if (carry.memory() == MemoryKind::kCuda) {
#if RA_HAVE_CUDA
    finalize_cuda(carry, sinks, o, lse, static_cast<cudaStream_t>(cuda_stream));
#endif
    return;
  }
  const int64_t B = carry.batch, H = carry.heads, T = carry.rows, dv = carry.value_dim;
  RA_CHECK(o.rank() == 4 && o.dim(0) == B && o.dim(1) == T && o.dim(2) == H && o.dim(3) == dv,
           "output o has shape ", o.shape().str(), ", expected (", B, ", ", T, ", ", H, ", ", dv, ")");
  RA_CHECK(lse.dtype() == DType::kF32 && lse.numel() == B * H * T, "output lse must be f32 (", B, ", ", H, ", ",
           T, ")");
  const float* num = carry.numerator.data<float>();
  const float* den = carry.denominator.data<float>();
  const float* mx = carry.max.data<float>();
  float* lse_out = lse.data_as<float>();
  std::vector<float> row(dv);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        int64_t r = (b * H + h) * T + t;
        const float sink = sinks.defined() ? sinks.data_as<float>()[h * sinks.stride(0)] : 0.0f;
        const auto [scale, row_lse] = softmax_normalize(SoftmaxState<float>{mx[r], den[r]}, sinks.defined(), sink);
        for (int64_t d = 0; d < dv; ++d) row[d] = num[r * dv + d] * scale;
        lse_out[r] = row_lse;
        char* dst = static_cast<char*>(o.data()) +
                    (b * o.stride(0) + t * o.stride(1) + h * o.stride(2)) * int64_t(dtype_size(o.dtype()));
        convert_from_f32(row.data(), dst, o.dtype(), size_t(dv));
      }
}

}  // namespace ra
