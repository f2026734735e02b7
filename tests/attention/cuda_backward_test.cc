// The CUDA backward of every implementation against the f64 oracle's gradients (on the host), on
// randomised shapes with every option it runs; the tolerance counts the kernels' rounding of P and
// dS to the input dtype before their products. Skips without a GPU.
#include <gtest/gtest.h>

#include <random>

#include "attention/cuda/flash_wgmma.h"
#include "attention/registry.h"
#include "runtime/cuda_device.h"
#include "runtime/memory.h"
#include "runtime/random.h"
#include "tests/support/flash_kernel_choice.h"
#include "tests/support/problem.h"

namespace ra::test {
namespace {

struct CudaGradCase {
  std::string impl;
  ProblemSpec spec;
  FlashCudaKernel kernel = FlashCudaKernel::kAuto;  // flash_attn2 only
};

std::vector<CudaGradCase> cuda_grad_cases() {
  struct Shape {
    int64_t b, t, s, hq, hkv, d;
  };
  const Shape shapes[] = {{2, 77, 77, 4, 4, 64}, {1, 131, 203, 8, 4, 128}, {1, 150, 97, 4, 1, 64},
                          {2, 1, 97, 8, 2, 128}, {1, 190, 190, 2, 2, 128}, {1, 70, 133, 4, 2, 32}};
  std::vector<CudaGradCase> cases;
  uint64_t seed = 500;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (const Options& opt : option_sets()) {
      const Shape& sh = shapes[seed % std::size(shapes)];
      cases.push_back({"sdpa", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}});
    }
  // flash_attn2: every option alone and combined, D 64 / 128, GQA, T = 1, S != T.
  const Shape flash_shapes[] = {{2, 77, 77, 4, 4, 64},  {1, 131, 203, 8, 4, 128}, {1, 150, 97, 4, 1, 64},
                                {2, 1, 97, 8, 2, 128},  {1, 190, 190, 2, 2, 128}, {1, 300, 517, 4, 1, 64}};
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (const Options& opt : option_sets())
      for (int repeat = 0; repeat < 2; ++repeat) {
        const Shape& sh = flash_shapes[seed % std::size(flash_shapes)];
        cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}});
      }
  // Both flash backward kernels forced on the options the wgmma one runs (positions only): D 64 / 128,
  // several key blocks with a partial last one, query blocks crossing 64 / 128 rows, GQA, T = 1.
  const Shape wgmma_shapes[] = {{1, 300, 517, 4, 1, 64}, {1, 257, 130, 8, 2, 128}, {2, 77, 77, 4, 4, 128},
                                {2, 1, 97, 8, 2, 64},    {1, 190, 190, 2, 2, 128}, {1, 131, 203, 8, 4, 64}};
  for (FlashCudaKernel kernel : {FlashCudaKernel::kWgmma, FlashCudaKernel::kMmaSync})
    for (DType dtype : {DType::kF16, DType::kBF16})
      for (const Options& opt : positional_option_sets())
        for (int repeat = 0; repeat < 2; ++repeat) {
          const Shape& sh = wgmma_shapes[seed % std::size(wgmma_shapes)];
          cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}, kernel});
        }
#if RA_HAVE_CUDNN
  // cudnn: causal with S >= T, sinks (their gradient comes from LSE and delta), GQA, D 64 / 128.
  const Shape cudnn_shapes[] = {{2, 77, 77, 4, 4, 64}, {1, 131, 203, 8, 4, 128}, {1, 300, 517, 4, 1, 64},
                                {2, 1, 97, 8, 2, 128}};
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (int o = 0; o < 4; ++o) {
      Options opt;
      opt.causal = o % 2 == 1;
      opt.sinks = o >= 2;
      const Shape& sh = cudnn_shapes[seed % std::size(cudnn_shapes)];
      cases.push_back({"cudnn", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}});
    }
#endif
  return cases;
}

void PrintTo(const CudaGradCase& c, std::ostream* os) {
  *os << c.impl << "/" << dtype_name(c.spec.dtype) << "/" << kernel_name(c.kernel);
}

class CudaBackwardVsReference : public testing::TestWithParam<CudaGradCase> {};

TEST_P(CudaBackwardVsReference, MatchesF64Gradients) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const CudaGradCase& c = GetParam();
  if (c.kernel == FlashCudaKernel::kWgmma && !flash_wgmma_available()) GTEST_SKIP() << "no sm_90a code or not a Hopper GPU";
  const ScopedFlashKernel kernel(c.kernel);
  Problem problem(c.spec);
  const AttentionInputs host_in = problem.inputs();
  const InputsCopy device_in = copy_inputs(host_in, MemoryKind::kCuda);
  std::mt19937_64 rng(c.spec.seed * 31 + 7);
  const Tensor d_o = random_normal(c.spec.dtype, {c.spec.batch, c.spec.q_len, c.spec.q_heads, c.spec.v_head_dim}, rng, 1.0f);
  const Tensor d_o_device = to_memory(d_o, MemoryKind::kCuda);
  auto impl = AttentionRegistry::builtin().create(c.impl, Backend::kCuda);
  ASSERT_TRUE(impl->has_backward());
  Gradients g;
  try {
    g = impl->backward(device_in.inputs, problem.params(), d_o_device);
  } catch (const Error& e) {
    if (c.impl == "cudnn" && e.message().find("does not run it on this GPU") != std::string::npos) GTEST_SKIP() << e.message();
    throw;
  }
  RA_CUDA_CHECK(cudaDeviceSynchronize());
  const ReferenceGradients ref = reference_attention_backward_f64(
      host_in, problem.params(), TokenPositions::dense(c.spec.q_len, c.spec.kv_len), d_o);
  const DType rounded = c.impl == "sdpa" ? DType::kF32 : c.spec.dtype;  // sdpa keeps f32 throughout
  auto expect = [&](const Tensor& got, const std::vector<double>& want, const char* name) {
    const GradientComparison cmp = compare_gradient(to_memory(got, MemoryKind::kHost), want, rounded);
    EXPECT_EQ(cmp.nan, 0) << name;
    EXPECT_EQ(cmp.wrong, 0) << name << ": max |error| " << cmp.max_abs_error << " (tolerance " << cmp.tolerance << ")";
  };
  expect(g.dq, ref.dq, "dq");
  expect(g.dk, ref.dk, "dk");
  expect(g.dv, ref.dv, "dv");
  if (host_in.bias.defined()) expect(g.dbias, ref.dbias, "dbias");
  if (host_in.sinks.defined()) expect(g.dsinks, ref.dsinks, "dsinks");
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaBackwardVsReference, testing::ValuesIn(cuda_grad_cases()), [](const auto& info) {
  const CudaGradCase& c = info.param;
  const ProblemSpec& s = c.spec;
  const std::string kernel = c.kernel == FlashCudaKernel::kAuto ? "" : std::string("_") + kernel_name(c.kernel);
  return c.impl + kernel + "_" + std::string(dtype_name(s.dtype)) + "_" + s.options.name() + "_T" + std::to_string(s.q_len) +
         "_S" + std::to_string(s.kv_len) + "_D" + std::to_string(s.head_dim) + "_G" + std::to_string(s.q_heads / s.kv_heads);
});

}  // namespace
}  // namespace ra::test
