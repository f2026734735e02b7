// The soft cap's two forms of tanh (flash_tile.cuh: soft_cap_tanh, the backward's, and soft_cap_tanh_short,
// the forwards', with its scale folded into the exponent) against tanh in f64 on the GPU: a dense sweep where
// tanh bends, the ends (huge, infinite, denormal, signed zeros) and NaN. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/cuda/flash_tile.cuh"
#include "runtime/cuda_device.h"

namespace ra::test {
namespace {

// out[i] = tanh(k in[i]): soft_cap_tanh where k is 0 (for 1), else soft_cap_tanh_short.
__global__ void soft_cap_tanh_kernel(const float* in, float* out, int n, float k) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = k == 0.0f ? flash::soft_cap_tanh(in[i]) : flash::soft_cap_tanh_short(in[i], k * flash::kTanhExponentScale);
}

std::vector<float> soft_cap_tanh_on_device(const std::vector<float>& in, float k) {
  float *d_in = nullptr, *d_out = nullptr;
  const size_t bytes = in.size() * sizeof(float);
  RA_CUDA_CHECK(cudaMalloc(&d_in, bytes));
  RA_CUDA_CHECK(cudaMalloc(&d_out, bytes));
  RA_CUDA_CHECK(cudaMemcpy(d_in, in.data(), bytes, cudaMemcpyHostToDevice));
  const int n = int(in.size());
  soft_cap_tanh_kernel<<<(n + 255) / 256, 256>>>(d_in, d_out, n, k);
  RA_CUDA_CHECK(cudaGetLastError());
  std::vector<float> out(in.size());
  RA_CUDA_CHECK(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost));
  RA_CUDA_CHECK(cudaFree(d_in));
  RA_CUDA_CHECK(cudaFree(d_out));
  return out;
}

TEST(SoftCapTanh, MatchesTanhInF64) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<float> x;
  for (int i = -200000; i <= 200000; ++i) x.push_back(float(i) * 1e-4f);  // [-20, 20]: past where f32 tanh is 1
  const float inf = std::numeric_limits<float>::infinity(), denormal = std::numeric_limits<float>::denorm_min();
  for (float v : {0.0f, 1e-30f, denormal, 1e-7f, 8.99f, 9.0f, 9.01f, 44.0f, 89.0f, 1e30f, 3e38f, inf}) {
    x.push_back(v);
    x.push_back(-v);
  }
  // k = 0: soft_cap_tanh; else soft_cap_tanh_short of k x (k: the cap's scale / cap, folded into the exponent).
  for (float k : {0.0f, 1.0f, 0.02f, 3.0f}) {
    SCOPED_TRACE("k = " + std::to_string(k));
    const std::vector<float> t = soft_cap_tanh_on_device(x, k);
    double worst = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::tanh((k == 0.0f ? 1.0 : double(k)) * double(x[i]));
      ASSERT_FALSE(std::isnan(t[i])) << "x = " << x[i];
      worst = std::max(worst, std::fabs(double(t[i]) - want));
      if (std::fabs(want) > 1e-6) EXPECT_EQ(std::signbit(t[i]), std::signbit(x[i])) << "x = " << x[i];
    }
    EXPECT_LT(worst, 5e-7);  // f32 rounding near 1 (an ulp of 1 is 1.2e-7); 3.4e-7 and 3.6e-7 expected
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> t_nan = soft_cap_tanh_on_device({nan, -nan}, k);
    EXPECT_TRUE(std::isnan(t_nan[0]) && std::isnan(t_nan[1])) << "NaN stays NaN";
  }
}

}  // namespace
}  // namespace ra::test
