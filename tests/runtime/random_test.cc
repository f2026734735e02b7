// random_normal: the same generator state gives the same bits for any thread count, successive calls
// differ, and the values are standard normal (moments and tail mass of 200k draws).
#include "runtime/random.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "tests/support/same_bits.h"

namespace ra {
namespace {

using test::same_bits;

Tensor draw(int threads, uint64_t seed, int64_t n, std::mt19937_64* rng = nullptr) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::mt19937_64 own(seed);
  Tensor t = random_normal(DType::kF32, {n}, rng ? *rng : own);
  omp_set_num_threads(before);
  return t;
}

TEST(RandomNormal, SameBitsForAnyThreadCountAndOddLengths) {
  for (int64_t n : {1, 2, 4095, 4097, 100001}) EXPECT_TRUE(same_bits(draw(1, 7, n), draw(3, 7, n))) << n;
  const Tensor longer = draw(1, 7, 100001), shorter = draw(2, 7, 4097);
  EXPECT_EQ(std::memcmp(longer.view().data(), shorter.view().data(), shorter.view().nbytes()), 0);  // a prefix
}

TEST(RandomNormal, SuccessiveCallsAndSeedsDiffer) {
  std::mt19937_64 rng(7);
  const Tensor first = draw(2, 0, 1000, &rng), second = draw(2, 0, 1000, &rng);
  EXPECT_FALSE(same_bits(first, second));
  EXPECT_FALSE(same_bits(draw(2, 7, 1000), draw(2, 8, 1000)));
}

TEST(RandomNormal, ValuesAreStandardNormal) {
  const int64_t n = 200000;
  const Tensor t = draw(2, 11, n);
  const float* x = t.data<float>();
  double mean = 0, var = 0, beyond2 = 0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= double(n);
  for (int64_t i = 0; i < n; ++i) {
    var += (x[i] - mean) * (x[i] - mean);
    beyond2 += std::fabs(x[i]) > 2.0f;
    ASSERT_TRUE(std::isfinite(x[i]));
  }
  var /= double(n);
  EXPECT_NEAR(mean, 0.0, 0.01);                  // 4.5 standard errors
  EXPECT_NEAR(var, 1.0, 0.02);                   // about 6 standard errors
  EXPECT_NEAR(beyond2 / double(n), 0.0455, 0.003);  // P(|z| > 2)
}

}  // namespace
}  // namespace ra
