// Every CPU implementation against the f64 reference on randomised shapes (odd lengths, S != T,
// D in {32, 64, 80, 128}, GQA 1/2/4/8), each dtype, every option alone and all combined.
#include <gtest/gtest.h>

#include "attention/cpu/flash_cpu.h"
#include "attention/registry.h"
#include "tests/support/problem.h"

namespace ra::test {
namespace {

struct KernelCase {
  std::string impl;
  Backend backend;
  ProblemSpec spec;
};

std::string case_name(const testing::TestParamInfo<KernelCase>& info) {
  const KernelCase& c = info.param;
  const ProblemSpec& s = c.spec;
  return c.impl + "_" + std::string(backend_name(c.backend)) + "_" + std::string(dtype_name(s.dtype)) + "_" +
         s.options.name() + "_T" + std::to_string(s.q_len) + "_S" + std::to_string(s.kv_len) + "_D" +
         std::to_string(s.head_dim) + "_G" + std::to_string(s.q_heads / s.kv_heads);
}


std::vector<KernelCase> all_cases() {
  struct Shape {
    int64_t b, t, s, hq, hkv, d, dv;
  };
  const Shape shapes[] = {{2, 77, 77, 4, 4, 32, 32},    {1, 131, 203, 8, 4, 64, 64}, {1, 67, 150, 4, 1, 80, 48},
                          {1, 100, 65, 8, 1, 128, 128}, {2, 1, 97, 8, 2, 64, 64},    {1, 150, 129, 8, 8, 128, 80}};
  std::vector<KernelCase> cases;
  const std::pair<const char*, Backend> impls[] = {
      {"sdpa", Backend::kCpu}, {"flash_attn2", Backend::kCpu}, {"flash_attn2", Backend::kNative}, {"blockwise", Backend::kCpu}};
  uint64_t seed = 1;
  for (auto [impl, backend] : impls)
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
      for (const Options& opt : option_sets()) {
        const Shape& sh = shapes[seed % std::size(shapes)];
        ProblemSpec spec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.dv, dtype, opt, seed++};
        cases.push_back({impl, backend, spec});
      }
  // A mask of documents: blocks it hides whole (skipped by the flash kernels), keeps whole (run unmasked) and keeps
  // in part, alone and causal, the mask's three shapes by seed.
  for (Backend backend : {Backend::kCpu, Backend::kNative})
    for (DType dtype : {DType::kF32, DType::kBF16})
      for (bool causal : {false, true}) {
        Options opt;
        opt.mask = opt.mask_documents = true;
        opt.causal = causal;
        cases.push_back({"flash_attn2", backend, ProblemSpec{2, 300, 517, 4, 2, 64, 64, dtype, opt, seed++}});
      }
  return cases;
}

void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.impl << "/" << backend_name(c.backend); }

class KernelVsReference : public testing::TestWithParam<KernelCase> {};

TEST_P(KernelVsReference, MatchesF64Reference) {
  const KernelCase& c = GetParam();
  Problem problem(c.spec);
  if (c.impl == "blockwise") {  // uneven chunks exercise the scan's merges
    problem.params().block_q = 29;
    problem.params().block_k = 41;
  }
  auto impl = AttentionRegistry::builtin().create(c.impl, c.backend);
  AttentionInputs in = problem.inputs();
  AttentionOutput out = impl->forward(in, problem.params());
  ReferenceOutput ref = reference_attention_f64(in, problem.params(), TokenPositions::dense(c.spec.q_len, c.spec.kv_len));
  double scale = c.spec.options.dropout ? 1.0 / (1.0 - problem.params().dropout_prob) : 1.0;
  double tol = output_tolerance(c.spec.dtype, max_abs_value(in.v) * scale);
  Comparison cmp = compare(out.o, out.lse, ref, tol, kLseTolerance);
  EXPECT_EQ(cmp.nan, 0);
  EXPECT_EQ(cmp.wrong, 0) << "max |error| " << cmp.max_abs_error << " (tolerance " << tol << "), max LSE error "
                          << cmp.max_lse_error;
}

INSTANTIATE_TEST_SUITE_P(Cpu, KernelVsReference, testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace ra::test

namespace ra::test {
namespace {

// Each SIMD variant of the CPU flash kernel on its own (the registry picks only the best one).
class FlashIsa : public testing::TestWithParam<CpuIsa> {};

TEST_P(FlashIsa, MatchesF64Reference) {
  const CpuIsa isa = GetParam();
  if (isa == CpuIsa::kAvx512 && best_cpu_isa() != CpuIsa::kAvx512) GTEST_SKIP() << "no AVX-512 here";
  if (isa == CpuIsa::kAvx2 && best_cpu_isa() == CpuIsa::kGeneric) GTEST_SKIP() << "no AVX2 here";
  for (uint64_t seed : {11, 12}) {
    ProblemSpec spec{2, 97, 130, 8, 2, 80, 72, DType::kF32, Options{true, true, true, true, true, true, true, false}, seed};
    Problem p(spec);
    AttentionInputs in = p.inputs();
    TokenPositions pos = TokenPositions::dense(97, 130);
    Carry carry = Carry::empty(2, 8, 97, 72);
    flash_accumulate_cpu(in, pos, p.params(), carry, isa);
    Tensor o(DType::kF32, {2, 97, 8, 72}), lse(DType::kF32, {2, 8, 97});
    finalize(carry, in.sinks, o, lse);
    Comparison cmp = compare(o, lse, reference_attention_f64(in, p.params(), pos),
                             output_tolerance(DType::kF32, max_abs_value(in.v)), kLseTolerance);
    EXPECT_EQ(cmp.wrong, 0) << cpu_isa_name(isa) << " max |error| " << cmp.max_abs_error;
    EXPECT_EQ(cmp.nan, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, FlashIsa, testing::Values(CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

}  // namespace
}  // namespace ra::test
