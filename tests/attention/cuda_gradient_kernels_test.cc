// The backward's elementwise device kernels (attention/cuda/backward_cuda.h) against the same arithmetic
// on the host, bit for bit: add_rows_cuda into strided rows of a larger f32 accumulator and
// convert_f32_cuda to each dtype, on shapes that take the vectorised path (rows of a multiple of 4
// elements, aligned) and on shapes that fall back to the scalar one (odd rows, an unaligned start).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

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
