// The backward's elementwise device kernels (attention/cuda/backward_cuda.h) against the same arithmetic
// on the host, bit for bit: add_rows_cuda into strided rows of a larger f32 accumulator and
// convert_f32_cuda to each dtype, on shapes that take the vectorised path (rows of a multiple of 4
// elements, aligned) and on shapes that fall back to the scalar one (odd rows, an unaligned start).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "attention/cuda/backward_cuda.h"
#include "attention/validate.h"
#include "runtime/cuda_device.h"
#include "runtime/memory.h"
#include "runtime/random.h"
#include "tests/support/problem.h"

namespace ra::test {
namespace {

struct RowsCase {
  int64_t b, l, h, x, offset;  // from is (b, l, h, x); into has l + offset + 2 rows, from's land at `offset`
};

TEST(CudaGradientKernels, AddRowsMatchesTheHostBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const RowsCase cases[] = {{1, 64, 4, 128, 3}, {2, 33, 3, 64, 1}, {1, 17, 3, 6, 1}, {2, 5, 2, 7, 2}, {1, 9, 1, 4, 0}};
  std::mt19937_64 rng(7);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (const RowsCase& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " x=" + std::to_string(c.x) + " offset=" +
                   std::to_string(c.offset));
      const Tensor from = random_normal(dtype, {c.b, c.l, c.h, c.x}, rng);
      const Tensor into = random_normal(DType::kF32, {c.b, c.l + c.offset + 2, c.h, c.x}, rng);
      const Tensor from_device = to_memory(from.view(), MemoryKind::kCuda);
      const Tensor into_device = to_memory(into.view(), MemoryKind::kCuda);
      add_rows_cuda(narrow(into_device.view(), 1, c.offset, c.l), from_device.view(), nullptr);
      RA_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<float> want = as_f32(into.view());
      const std::vector<float> add = as_f32(from.view());
      const int64_t row = c.h * c.x, into_rows = c.l + c.offset + 2;
      for (int64_t b = 0; b < c.b; ++b)
        for (int64_t l = 0; l < c.l; ++l)
          for (int64_t i = 0; i < row; ++i)
            want[size_t((b * into_rows + l + c.offset) * row + i)] += add[size_t((b * c.l + l) * row + i)];
      const std::vector<float> got = as_f32(into_device.view());
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    }
}

TEST(CudaGradientKernels, ConvertMatchesTheHostBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t n : {int64_t(1) << 20, int64_t(4099), int64_t(3)}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " n=" + std::to_string(n));
      const Tensor in = random_normal(DType::kF32, {n + 1}, rng, 100.0f);
      const Tensor in_device = to_memory(in.view(), MemoryKind::kCuda);
      for (int64_t start : {int64_t(0), int64_t(1)}) {  // 1: an unaligned start takes the scalar kernel
        const Tensor out_device(dtype, {n}, MemoryKind::kCuda);
        convert_f32_cuda(narrow(in_device.view(), 0, start, n), out_device.view(), nullptr);
        RA_CUDA_CHECK(cudaDeviceSynchronize());
        const Tensor got = to_memory(out_device.view(), MemoryKind::kHost);
        std::vector<char> want(size_t(n) * dtype_size(dtype));
        convert_from_f32(in.data<float>() + start, want.data(), dtype, size_t(n));
        EXPECT_EQ(std::memcmp(got.data<char>(), want.data(), want.size()), 0) << "start " << start;
      }
    }
}

// compute_delta_cuda (delta = rowsum(dO * O) - dLSE) on rows that load as vectors and on rows that do not (an odd
// Dv, or O and dO read from rows one element longer at an unaligned start): the same bits either way (a ring's shard
// or a view of O gives the same delta as the whole tensor), within f32's rounding of an f64 sum, for each pair of
// dtypes the backward takes (dO in f32 beside half-precision O too); T = 1 (decoding), one block of rows and several;
// the rows of a dQ accumulator it zeroes in the same pass all zero.
TEST(CudaGradientKernels, DeltaIsTheSameBitsOnAnyStridesAndMatchesF64) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 2, H = 3;
  std::mt19937_64 rng(9);
  // rows of `t` one element longer, t's values after a first one: a strided view at an unaligned start
  auto widened = [](const Tensor& t) {
    const int64_t dv = t.view().dim(3);
    Tensor wide(t.view().dtype(), {t.view().dim(0), t.view().dim(1), t.view().dim(2), dv + 1}, MemoryKind::kHost);
    const size_t size = dtype_size(t.view().dtype());
    for (int64_t row = 0; row < t.view().numel() / dv; ++row)
      std::memcpy(wide.data<char>() + size_t(row * (dv + 1) + 1) * size, t.data<char>() + size_t(row * dv) * size,
                  size_t(dv) * size);
    return wide;
  };
  auto random_of = [&](DType dtype, const Shape& shape) {  // random_normal has no f64: f32 values widened
    if (dtype != DType::kF64) return random_normal(dtype, shape, rng);
    const Tensor narrow32 = random_normal(DType::kF32, shape, rng);
    Tensor wide(DType::kF64, shape);
    for (int64_t i = 0; i < shape.numel(); ++i) wide.data<double>()[i] = narrow32.data<float>()[i];
    return wide;
  };
  const std::pair<DType, DType> pairs[] = {{DType::kBF16, DType::kBF16}, {DType::kF16, DType::kF16},
                                           {DType::kF32, DType::kF32},   {DType::kBF16, DType::kF32},
                                           {DType::kF16, DType::kF32},   {DType::kF64, DType::kF64}};
  for (const auto& [o_dtype, do_dtype] : pairs)
    for (int64_t T : {1, 37, 300})
      for (int64_t dv : {1, 7, 8, 64, 80, 128, 200, 256, 520}) {
        SCOPED_TRACE(std::string(dtype_name(o_dtype)) + " o, " + std::string(dtype_name(do_dtype)) + " do, T=" +
                     std::to_string(T) + ", Dv=" + std::to_string(dv));
        const Tensor o = random_of(o_dtype, {B, T, H, dv}), d_o = random_of(do_dtype, {B, T, H, dv});
        const Tensor d_lse = random_normal(DType::kF32, {B, H, T}, rng);
        const Tensor o_dev = to_memory(o.view(), MemoryKind::kCuda), do_dev = to_memory(d_o.view(), MemoryKind::kCuda);
        const Tensor o_wide = to_memory(widened(o).view(), MemoryKind::kCuda);
        const Tensor do_wide = to_memory(widened(d_o).view(), MemoryKind::kCuda);
        const Tensor d_lse_dev = to_memory(d_lse.view(), MemoryKind::kCuda);
        const Tensor whole(DType::kF32, {B, H, T}, MemoryKind::kCuda);
        const Tensor strided(DType::kF32, {B, H, T}, MemoryKind::kCuda);
        const Tensor with_lse(DType::kF32, {B, H, T}, MemoryKind::kCuda);
        // the dQ accumulator that delta's pass zeroes, of another width than Dv, holding NaN before
        const int64_t zero_width = 4 * ((dv + 3) / 4) + 4;
        const Tensor zero(DType::kF32, {B, T, H, zero_width}, MemoryKind::kCuda);
        RA_CUDA_CHECK(cudaMemset(zero.data<float>(), 0xff, zero.view().nbytes()));
        compute_delta_cuda(o_dev.view(), do_dev.view(), TensorView(), whole.view(), nullptr, zero.view());
        compute_delta_cuda(narrow(o_wide.view(), 3, 1, dv), narrow(do_wide.view(), 3, 1, dv), TensorView(),
                           strided.view(), nullptr);
        compute_delta_cuda(o_dev.view(), do_dev.view(), d_lse_dev.view(), with_lse.view(), nullptr);
        RA_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> got = as_f32(whole.view()), got_strided = as_f32(strided.view());
        const std::vector<float> got_lse = as_f32(with_lse.view()), lse = as_f32(d_lse.view());
        EXPECT_EQ(std::memcmp(got.data(), got_strided.data(), got.size() * sizeof(float)), 0) << "strided rows differ";
        const std::vector<float> zeros = as_f32(zero.view());
        EXPECT_EQ(std::count(zeros.begin(), zeros.end(), 0.0f), int64_t(zeros.size())) << "the zero rows";
        const std::vector<float> x = as_f32(o.view()), y = as_f32(d_o.view());
        int wrong = 0;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h) {
              double want = 0, scale = 0;
              for (int64_t d = 0; d < dv; ++d) {
                const size_t i = size_t(((b * T + t) * H + h) * dv + d);
                want += double(x[i]) * y[i], scale += std::abs(double(x[i]) * y[i]);
              }
              const size_t r = size_t((b * H + h) * T + t);
              wrong += std::abs(got[r] - want) > double(dv) * 1.2e-7 * scale;  // recursive summation's bound
              wrong += got_lse[r] != got[r] - lse[r];
            }
        EXPECT_EQ(wrong, 0);
      }
}

// add_convert_cuda (the GPU ring's last hop: the own block's f32 dK / dV plus the accumulator that came
// home, in the output's dtype): the host's f32 sum rounded once, for each addend and output dtype, fused
// (aligned rows of 4) and through the fallback (odd counts, an unaligned start).
TEST(CudaGradientKernels, AddConvertMatchesTheHostBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(9);
  for (DType addend_dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (DType out_dtype : {DType::kF32, DType::kF16, DType::kBF16})
      for (int64_t n : {int64_t(1) << 18, int64_t(4099)})
        for (int64_t start : {int64_t(0), int64_t(1)}) {
          SCOPED_TRACE(std::string(dtype_name(addend_dtype)) + " -> " + std::string(dtype_name(out_dtype)) + " n=" +
                       std::to_string(n) + " start=" + std::to_string(start));
          const Tensor sum = random_normal(DType::kF32, {n + 1}, rng, 10.0f);
          const Tensor addend = random_normal(addend_dtype, {n}, rng, 10.0f);
          const Tensor sum_device = to_memory(sum.view(), MemoryKind::kCuda);
          const Tensor addend_device = to_memory(addend.view(), MemoryKind::kCuda);
          const Tensor out_device(out_dtype, {n}, MemoryKind::kCuda);
          add_convert_cuda(narrow(sum_device.view(), 0, start, n), addend_device.view(), out_device.view(), nullptr);
          RA_CUDA_CHECK(cudaDeviceSynchronize());
          std::vector<float> want = as_f32(narrow(sum.view(), 0, start, n));
          const std::vector<float> add = as_f32(addend.view());
          for (size_t i = 0; i < want.size(); ++i) want[i] += add[i];
          std::vector<char> want_bits(size_t(n) * dtype_size(out_dtype));
          convert_from_f32(want.data(), want_bits.data(), out_dtype, size_t(n));
          const Tensor got = to_memory(out_device.view(), MemoryKind::kHost);
          EXPECT_EQ(std::memcmp(got.data<char>(), want_bits.data(), want_bits.size()), 0);
        }
}

}  // namespace
}  // namespace ra::test
