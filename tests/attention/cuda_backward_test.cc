// The CUDA backward of every implementation against the f64 oracle's gradients (on the host), on
// randomised shapes with every option it runs (flash_attn2 at head_dim 32, 64, 96, 128, 192 and 256); the tolerance
// counts the kernels' rounding of P and dS to the input dtype before their products. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
#include <tuple>
#include <utility>

#include "attention/backward.h"
#include "attention/compare.h"
#include "attention/cpu/sdpa_cpu.h"
#include "attention/cuda/cuda_inputs.h"
#include "attention/cuda/flash_wgmma.h"
#include "attention/cuda/mask_tiles.h"
#include "attention/registry.h"
#include "attention/tolerance.h"
#include "runtime/cuda_device.h"
#include "runtime/memory.h"
#include "runtime/random.h"
#include "tests/support/cudnn_head_dims.h"
#include "tests/support/flash_kernel_choice.h"
#include "tests/support/problem.h"
#include "tests/support/same_bits.h"

namespace ra::test {
namespace {

struct CudaGradCase {
  std::string impl;
  ProblemSpec spec;
  FlashKernel kernel = FlashKernel::kAuto;  // flash_attn2 only
  bool slice_offsets = false;  // the call as a slice of bigger tensors: dropout keyed by global batch and head
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
  // head_dim 256 (the mma.sync kernel: two warps share 16 keys, P^T through shared memory): every option
  // alone and combined, both dtypes, key blocks of 64 with a partial last one, GQA, T = 1, S != T.
  const Shape wide_shapes[] = {{1, 131, 203, 8, 4, 256}, {2, 1, 97, 4, 2, 256}, {1, 190, 190, 2, 2, 256},
                               {1, 77, 130, 4, 1, 256}};
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (const Options& opt : option_sets()) {
      const Shape& sh = wide_shapes[seed % std::size(wide_shapes)];
      cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}});
    }
  // Both flash backward kernels forced on positions and segment ids: D 64 / 128,
  // several key blocks with a partial last one, query blocks crossing 64 / 128 rows, GQA, T = 1.
  const Shape wgmma_shapes[] = {{1, 300, 517, 4, 1, 64}, {1, 257, 130, 8, 2, 128}, {2, 77, 77, 4, 4, 128},
                                {2, 1, 97, 8, 2, 64},    {1, 190, 190, 2, 2, 128}, {1, 131, 203, 8, 4, 64}};
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
    for (DType dtype : {DType::kF16, DType::kBF16})
      for (const Options& opt : wgmma_option_sets())
        for (int repeat = 0; repeat < 2; ++repeat) {
          const Shape& sh = wgmma_shapes[seed % std::size(wgmma_shapes)];
          cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}, kernel});
        }
  // The wgmma kernel at head_dim 256 (two warpgroups share 64 keys) on positions and segment ids, both dtypes.
  const Shape wide_wgmma_shapes[] = {{1, 150, 201, 4, 2, 256}, {2, 1, 70, 4, 4, 256}, {1, 257, 130, 8, 2, 256}};
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (const Options& opt : wgmma_option_sets()) {
      const Shape& sh = wide_wgmma_shapes[seed % std::size(wide_wgmma_shapes)];
      cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++},
                       FlashKernel::kWgmma});
    }
  // A soft cap on both kernels forced (wgmma's instances of their own, with segment ids too: P from the
  // capped logits, dS times 1 - tanh^2), D 64 / 128 / 256.
  for (const Shape& sh : {wgmma_shapes[0], wgmma_shapes[1], wide_wgmma_shapes[0], wgmma_shapes[3], wide_wgmma_shapes[2]})
    for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
      for (const Options& opt : soft_cap_option_sets()) {
        const DType dtype = seed % 2 ? DType::kBF16 : DType::kF16;
        cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}, kernel});
      }
  // The extras instances (bias with dBias, mask, dropout regenerated, a soft cap beside a mask) on each
  // kernel forced, D 64 / 128 / 256.
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
    for (const Options& opt : extras_option_sets())
      for (const Shape& sh : {wgmma_shapes[seed % 2 ? 0 : 3], wgmma_shapes[seed % 2 ? 1 : 2], wide_wgmma_shapes[seed % 3]}) {
        const DType dtype = seed % 2 ? DType::kBF16 : DType::kF16;
        cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}, kernel});
      }
  // The wgmma backward's bias and mask instances (alone_cases), each kernel forced.
  for (bool Options::* extra : {&Options::bias, &Options::mask})
    for (const DocumentCase& c : alone_cases(extra, seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  // The mask instances on masks of documents, whole tiles hidden and kept (mask_tile_cases).
  for (const DocumentCase& c : mask_tile_cases(seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  // Packed and cycled documents on shapes of many key and query blocks (D 64 / 128 / 256): query blocks
  // that share no document with a key block are skipped, blocks inside one run unmasked; each kernel
  // forced without the extras and with them (document_cases).
  for (const DocumentCase& c :
       document_cases({{1, 700, 700, 4, 2, 128}, {2, 333, 600, 4, 4, 64}, {1, 400, 400, 2, 1, 256}}, seed))
    cases.push_back({"flash_attn2", c.spec, c.kernel});
  // Head dims between the instances and Dv != D (padded_head_dim_cases).
  std::vector<std::array<int64_t, 5>> padded_shapes;
  for (const Shape& sh : flash_shapes) padded_shapes.push_back({sh.b, sh.t, sh.s, sh.hq, sh.hkv});
  for (const DocumentCase& c : padded_head_dim_cases(padded_shapes, seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  // The wgmma backward's instances of 32, 96 and 192 columns (Q, dO, K, V in slabs of 32 columns; at 96
  // dQ's columns past D formed and dropped, at 192 the split layout): their exact head dims on every option
  // set the kernel runs (the extras at 32 and 96 go to the 64 and 128 instances), and the narrower dims they
  // serve, both dtypes, GQA, T = 1, several key blocks with a partial last one.
  const Shape slab32_shapes[] = {{1, 257, 330, 8, 2, 0}, {2, 1, 97, 4, 4, 0}, {1, 190, 190, 4, 1, 0}, {1, 133, 203, 8, 4, 0}};
  const std::pair<int64_t, int64_t> slab32_dims[] = {{80, 80}, {160, 160}, {192, 128}, {96, 64}, {136, 176}, {72, 96},
                                                     {48, 40}, {16, 24}};
  for (const Options& opt : every_instance_option_set())
    for (const auto& [d, dv] : {std::pair<int64_t, int64_t>{32, 32}, {96, 96}, {192, 192}, slab32_dims[seed % std::size(slab32_dims)]}) {
      const Shape& sh = slab32_shapes[seed % std::size(slab32_shapes)];
      const DType dtype = seed % 2 ? DType::kBF16 : DType::kF16;
      cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, d, dv, dtype, opt, seed++}, FlashKernel::kWgmma});
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
  // cudnn with v_head_dim != head_dim (MLA's 192 / 128 and others), each option it expresses.
  for (const ProblemSpec& spec : cudnn_head_dim_cases(seed)) cases.push_back({"cudnn", spec});
#endif
  // The wgmma backward's dQ apart (exact D = 192 / 256 on positions: the key-block kernel's dK / dV beside the
  // query-block kernel's dQ): many query blocks of 128 rows and key tiles of 64 with partial last ones, S > T
  // and S < T (causal rows that see no key: zero gradient), GQA, B = 2, both dtypes.
  const Shape apart_shapes[] = {{1, 700, 1100, 4, 2, 192}, {2, 333, 600, 4, 1, 256}, {1, 517, 300, 8, 4, 256},
                                {1, 389, 389, 2, 2, 192}};
  for (const Options& opt : wgmma_option_sets())
    for (int repeat = 0; repeat < 2; ++repeat) {
      const Shape& sh = apart_shapes[seed % std::size(apart_shapes)];
      const DType dtype = seed % 2 ? DType::kBF16 : DType::kF16;
      cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++},
                       FlashKernel::kWgmma});
    }
  // sdpa past flash_attn2's 256 columns (any head dim): D = 300, Dv = 264.
  Options causal_sinks;
  causal_sinks.causal = causal_sinks.sinks = true;
  cases.push_back({"sdpa", ProblemSpec{1, 77, 93, 4, 2, 300, 264, DType::kBF16, causal_sinks, seed++}});
  // Dropout keyed by a slice's global batch and head (AttentionParams::batch_offset / head_offset, as a mesh's
  // dp / tp ranks call it): the same decisions as the host's reference, on sdpa and each flash kernel.
  Options dropout;
  dropout.dropout = dropout.causal = true;
  for (const Shape& sh : {wgmma_shapes[2], wgmma_shapes[5]}) {
    const DType dtype = seed % 2 ? DType::kBF16 : DType::kF16;
    cases.push_back({"sdpa", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, dropout, seed++}, FlashKernel::kAuto, true});
    for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
      cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, dropout, seed++}, kernel, true});
  }
  // The wgmma backward's dropout instances (alone_cases: each row's key formed once), each kernel forced.
  for (const DocumentCase& c : alone_cases(&Options::dropout, seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  // And beside packed, cycled and long documents (dropout_document_cases).
  for (const DocumentCase& c : dropout_document_cases(seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  return cases;
}

void PrintTo(const CudaGradCase& c, std::ostream* os) {
  *os << c.impl << "/" << dtype_name(c.spec.dtype) << "/" << flash_kernel_name(c.kernel);
}

class CudaBackwardVsReference : public testing::TestWithParam<CudaGradCase> {};

// A problem on the host and on the device, with a random dO drawn from `do_seed`.
struct DeviceGradProblem {
  DeviceGradProblem(const ProblemSpec& spec, uint64_t do_seed)
      : problem(spec), host_in(problem.inputs()), dev(copy_inputs(host_in, MemoryKind::kCuda)) {
    std::mt19937_64 rng(do_seed);
    d_o = random_normal(spec.dtype, {spec.batch, spec.q_len, spec.q_heads, spec.v_head_dim}, rng, 1.0f);
    d_o_device = to_memory(d_o, MemoryKind::kCuda);
  }
  Problem problem;
  AttentionInputs host_in;
  InputsCopy dev;
  Tensor d_o, d_o_device;
};

// `impl`'s forward and backward of `setup`'s bf16 problem on `device_in` (its device inputs, or a view of them), at
// positions `pos`: O, LSE, dQ, dK and dV against the f64 reference's.
void expect_bf16_results_match_reference(const AttentionImpl& impl, DeviceGradProblem& setup,
                                         const AttentionInputs& device_in, const TokenPositions& pos) {
  const AttentionParams& params = setup.problem.params();
  const AttentionOutput out = impl.forward(device_in, params, pos);
  const Gradients g = impl.backward(device_in, params, pos, setup.d_o_device);
  RA_CUDA_CHECK(cudaDeviceSynchronize());
  const ReferenceOutput ref_out = reference_attention_f64(setup.host_in, params, pos);
  const Comparison o = compare(to_memory(out.o, MemoryKind::kHost), to_memory(out.lse, MemoryKind::kHost), ref_out,
                               output_tolerance(DType::kBF16, max_abs_value(setup.host_in.v)), kLseTolerance);
  EXPECT_EQ(o.nan, 0);
  EXPECT_EQ(o.wrong, 0) << "o: max |error| " << o.max_abs_error << ", max LSE error " << o.max_lse_error;
  const ReferenceGradients ref = reference_attention_backward_f64(setup.host_in, params, pos, setup.d_o);
  for (const auto& [got, want, name] : {std::tuple{&g.dq, &ref.dq, "dq"}, {&g.dk, &ref.dk, "dk"}, {&g.dv, &ref.dv, "dv"}}) {
    const GradientComparison cmp = compare_gradient(to_memory(*got, MemoryKind::kHost), *want, DType::kBF16);
    EXPECT_EQ(cmp.nan, 0) << name;
    EXPECT_EQ(cmp.wrong, 0) << name << ": max |error| " << cmp.max_abs_error << " (tolerance " << cmp.tolerance << ")";
  }
}

TEST_P(CudaBackwardVsReference, MatchesF64Gradients) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const CudaGradCase& c = GetParam();
  if (c.kernel == FlashKernel::kWgmma && !flash_wgmma_available()) GTEST_SKIP() << "no sm_90a code or not a Hopper GPU";
  DeviceGradProblem setup(c.spec, c.spec.seed * 31 + 7);
  auto& [problem, host_in, device_in, d_o, d_o_device] = setup;
  problem.params().flash_kernel = c.kernel;
  if (c.slice_offsets) problem.params().batch_offset = 3, problem.params().head_offset = 5;
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
  // dsinks sums P_sink * delta over every query row, terms that cancel: allowed per term (as verify does), not by the
  // largest head's value, which a head without a sink (dsinks 0) does not set.
  auto expect = [&](const Tensor& got, const std::vector<double>& want, const char* name,
                    const std::vector<double>* terms = nullptr) {
    const GradientComparison cmp = compare_gradient(to_memory(got, MemoryKind::kHost), want, rounded, terms);
    EXPECT_EQ(cmp.nan, 0) << name;
    EXPECT_EQ(cmp.wrong, 0) << name << ": max |error| " << cmp.max_abs_error << " (tolerance " << cmp.tolerance << ")";
  };
  expect(g.dq, ref.dq, "dq");
  expect(g.dk, ref.dk, "dk");
  expect(g.dv, ref.dv, "dv");
  if (host_in.bias.defined()) expect(g.dbias, ref.dbias, "dbias");
  if (host_in.sinks.defined()) expect(g.dsinks, ref.dsinks, "dsinks", &ref.dsinks_terms);
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaBackwardVsReference, testing::ValuesIn(cuda_grad_cases()), [](const auto& info) {
  const CudaGradCase& c = info.param;
  const ProblemSpec& s = c.spec;
  const std::string kernel = c.kernel == FlashKernel::kAuto ? "" : std::string("_") + flash_kernel_name(c.kernel);
  const std::string dv = s.v_head_dim == s.head_dim ? "" : "_Dv" + std::to_string(s.v_head_dim);
  return c.impl + kernel + "_" + std::string(dtype_name(s.dtype)) + "_" + s.options.name() + segment_ids_suffix(s.segment_ids) +
         "_T" + std::to_string(s.q_len) + "_S" + std::to_string(s.kv_len) + "_D" + std::to_string(s.head_dim) + dv + "_G" +
         std::to_string(s.q_heads / s.kv_heads) + (c.slice_offsets ? "_slice_offsets" : "");
});

// A named mask (AttentionInputs::mask_identity, as ringattn.torch names a tensor by its version) is summarised once:
// the second forward and backward read the kept summary and still give the mask's O and gradients. Other bytes at the
// same address under a new name (the tensor changed in place) get a summary of their own: the complement's. A mask
// that keeps most of its tiles whole (two large documents) runs, once its kept summary's counts are on the host, the
// forward instance that neither stages nor reads those tiles (MaskTiles::keeps_tiles_whole), with the same results.
TEST(CudaMaskTiles, ANamedMaskKeepsItsResultsAcrossCalls) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!flash_wgmma_available()) GTEST_SKIP() << "no sm_90a code or not a Hopper GPU";
  Options opt;
  opt.mask = opt.mask_documents = true;
  DeviceGradProblem setup(ProblemSpec{2, 333, 517, 4, 2, 64, 64, DType::kBF16, opt, 61}, 62);
  auto& [problem, host_in, device_in, d_o, d_o_device] = setup;
  problem.params().flash_kernel = FlashKernel::kWgmma;
  auto impl = AttentionRegistry::builtin().create("flash_attn2", Backend::kCuda);
  const TokenPositions pos = TokenPositions::dense(problem.spec().q_len, problem.spec().kv_len);
  AttentionInputs named = device_in.inputs;
  auto expect_results = [&](const char* which) {
    SCOPED_TRACE(which);
    expect_bf16_results_match_reference(*impl, setup, named, pos);
  };
  auto keeps_tiles_whole = [&] {
    const CudaStream stream;
    DevicePositionBuffer buffer;
    CudaAttentionArgs args = make_cuda_args(named, buffer.upload(pos, stream.get()), problem.params());
    const MaskTiles tiles(args, stream.get());
    stream.synchronize();
    return tiles.keeps_tiles_whole();
  };
  auto write_mask = [&](uint64_t name) {
    RA_CUDA_CHECK(cudaMemcpy(named.mask.data(), problem.mask.data<uint8_t>(), size_t(problem.mask.numel()),
                             cudaMemcpyHostToDevice));
    named.mask_identity = name;
  };
  named.mask_identity = 0x6e616d6564;
  expect_results("first call: the summary made and kept");
  expect_results("second call: the kept summary");
  uint8_t* bytes = problem.mask.data<uint8_t>();
  for (int64_t i = 0; i < problem.mask.numel(); ++i) bytes[i] = !bytes[i];
  write_mask(0x6e616d6565);
  expect_results("the complement under a new name");
  // Two documents, rows [0, 166) with keys [0, 256) and the rest with the rest: most kept tiles kept whole.
  const int64_t T = problem.spec().q_len, S = problem.spec().kv_len, maps = problem.mask.numel() / (T * S);
  for (int64_t m = 0; m < maps; ++m)
    for (int64_t r = 0; r < T; ++r)
      for (int64_t j = 0; j < S; ++j) bytes[(m * T + r) * S + j] = (r < 166) == (j < 256);
  write_mask(0x6e616d6566);
  expect_results("two documents: the plain instance while the counts are on their way");
  EXPECT_TRUE(keeps_tiles_whole());
  expect_results("two documents: the instance that skips the tiles kept whole");
  expect_results("two documents, again");
}

// Dropout's decisions of keys 8 apart share one finalizer (dropout_key_word), which the wgmma dropout instances form
// once for two pairs where the keys pair up (dropout_keys_pair_up); keys that do not take the extras instances. Key
// positions as a ring's blocks have them: a run from an offset off 16 (the extras), a run from a multiple of 16 past
// 0, every other position (the extras), two runs from multiples of 16 (a zigzag block: positions read, paired), and
// runs whose positions' high half is not 0: one across 2^32 (tiles under one high half step their keys' words, the
// tile across it forms them; drop_keyed) and one past 3 * 2^32; the forward and the backward against the f64
// reference at those positions, each kernel (mma.sync's dropout instance too), D 64, 128 and 256, with and without
// causal. Beside a soft cap (the extras instances; a bias or mask would span the positions), keys that pair up take
// the same pair form (dropout_pairs_keyed) and the others a finalizer a pair.
TEST(CudaDropout, KeyPositionsOffTheKernelsPairingMatchTheReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto impl = AttentionRegistry::builtin().create("flash_attn2", Backend::kCuda);
  uint64_t seed = 71;
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
    for (int64_t d : {64, 128, 256})
      for (bool causal : {false, true})
        for (bool soft_cap : {false, true})
          for (int layout = 0; layout < 6; ++layout) {
            if (kernel == FlashKernel::kWgmma && !flash_wgmma_available()) continue;
            Options opt;
            opt.dropout = true, opt.causal = causal, opt.softcap = soft_cap;
            const int64_t T = 203, S = 299;
            DeviceGradProblem setup(ProblemSpec{1, T, S, 4, 2, d, d, DType::kBF16, opt, seed}, seed + 1);
            ++seed;
            setup.problem.params().flash_kernel = kernel;
            TokenPositions pos;
            const int64_t two_to_32 = int64_t(1) << 32;
            for (int64_t j = 0; j < S; ++j)
              pos.k.push_back(layout == 0   ? 5 + j
                              : layout == 1 ? 48 + j
                              : layout == 2 ? 2 * j + 1
                              : layout == 3 ? (j < 144 ? j : 400 + j)
                              : layout == 4 ? two_to_32 - 144 + j
                                            : 3 * two_to_32 + 32 + j);
            for (int64_t i = 0; i < T; ++i) pos.q.push_back(pos.k[size_t(i + S - T)]);  // bottom-right: the last keys'
            pos.total_keys = pos.k.back() + 1;
            const char* layouts[] = {"a run from 5",      "a run from 48",        "every other",
                                     "two runs",          "a run across 2^32",    "a run past 3 * 2^32"};
            SCOPED_TRACE(std::string(flash_kernel_name(kernel)) + " D=" + std::to_string(d) + (causal ? " causal, " : ", ") +
                         layouts[layout] + (soft_cap ? " beside a soft cap" : ""));
            expect_bf16_results_match_reference(*impl, setup, setup.dev.inputs, pos);
          }
}

// A loss that reads LSE too: dLSE beside dO, from the implementation's forward (O in f32), through the
// accumulator path (f32 gradients, and any bias) and the direct one (q's dtype), each kernel, every option
// alone and combined; cudnn, whose backward forms rowsum(dO * O) itself, refuses it by name.
TEST(CudaLseInTheLoss, MatchesF64Gradients) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  struct Case {
    std::string impl;
    FlashKernel kernel;
    DType dtype;
  };
  std::vector<Case> cases = {{"sdpa", FlashKernel::kAuto, DType::kF32}, {"flash_attn2", FlashKernel::kMmaSync, DType::kF16}};
  if (flash_wgmma_available()) cases.push_back({"flash_attn2", FlashKernel::kWgmma, DType::kBF16});
  uint64_t seed = 900;
  for (const Case& c : cases)
    for (const Options& opt : option_sets())
      for (bool f32_gradients : {false, true}) {
        const ProblemSpec spec{2, 97, 131, 8, 2, 64, 64, c.dtype, opt, seed++};
        SCOPED_TRACE(c.impl + " " + flash_kernel_name(c.kernel) + " " + std::string(dtype_name(c.dtype)) + " " + opt.name() +
                     (f32_gradients ? " f32 gradients" : ""));
        DeviceGradProblem setup(spec, spec.seed * 31 + 7);
        auto& [problem, host_in, device_in, d_o, d_o_device] = setup;
        problem.params().flash_kernel = c.kernel;
        auto impl = AttentionRegistry::builtin().create(c.impl, Backend::kCuda);
        std::mt19937_64 rng(spec.seed);
        const Tensor d_lse = random_normal(DType::kF32, {spec.batch, spec.q_heads, spec.q_len}, rng, 1.0f);
        const Tensor d_lse_device = to_memory(d_lse, MemoryKind::kCuda);
        const TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
        const Tensor o(DType::kF32, {spec.batch, spec.q_len, spec.q_heads, spec.v_head_dim}, MemoryKind::kCuda);
        const Tensor lse(DType::kF32, {spec.batch, spec.q_heads, spec.q_len}, MemoryKind::kCuda);
        impl->forward_into(device_in.inputs, problem.params(), pos, ForwardViews{o.view(), lse.view()});
        const Gradients g = impl->backward(device_in.inputs, problem.params(), pos, d_o_device,
                                           ForwardViews{o.view(), lse.view()}, f32_gradients, nullptr, d_lse_device);
        RA_CUDA_CHECK(cudaDeviceSynchronize());
        const ReferenceGradients ref = reference_attention_backward_f64(host_in, problem.params(), pos, d_o, true, d_lse);
        const DType rounded = c.impl == "sdpa" ? DType::kF32 : c.dtype;
        auto expect = [&](const Tensor& got, const std::vector<double>& want, const char* name,
                          const std::vector<double>* terms = nullptr) {  // dsinks per term, as above
          const GradientComparison cmp = compare_gradient(to_memory(got, MemoryKind::kHost), want, rounded, terms);
          EXPECT_EQ(cmp.nan, 0) << name;
          EXPECT_EQ(cmp.wrong, 0) << name << ": max |error| " << cmp.max_abs_error << " (tolerance " << cmp.tolerance
                                  << ")";
        };
        expect(g.dq, ref.dq, "dq");
        expect(g.dk, ref.dk, "dk");
        expect(g.dv, ref.dv, "dv");
        if (host_in.bias.defined()) expect(g.dbias, ref.dbias, "dbias");
        if (host_in.sinks.defined()) expect(g.dsinks, ref.dsinks, "dsinks", &ref.dsinks_terms);
      }
#if RA_HAVE_CUDNN
  const ProblemSpec spec{1, 64, 64, 4, 4, 64, 64, DType::kBF16, Options{}, 7};
  DeviceGradProblem setup(spec, 8);
  auto impl = AttentionRegistry::builtin().create("cudnn", Backend::kCuda);
  const Tensor o(DType::kBF16, {1, 64, 4, 64}, MemoryKind::kCuda), lse(DType::kF32, {1, 4, 64}, MemoryKind::kCuda);
  const Tensor d_lse(DType::kF32, {1, 4, 64}, MemoryKind::kCuda);
  try {
    impl->backward(setup.dev.inputs, setup.problem.params(), TokenPositions::dense(64, 64), setup.d_o_device,
                   ForwardViews{o.view(), lse.view()}, false, nullptr, d_lse);
    ADD_FAILURE() << "cudnn took a dlse";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("a gradient with respect to lse (dlse) is not supported by 'cudnn'"), std::string::npos)
        << e.message();
  }
#endif
}

// The GPU implementations that write a single call's gradients into views themselves: flash_attn2, and cudnn where
// this build has it.
std::vector<std::string> flash_and_cudnn() {
#if RA_HAVE_CUDNN
  return {"flash_attn2", "cudnn"};
#else
  return {"flash_attn2"};
#endif
}

// forward_into and backward into the caller's views in q's dtype (a framework's tensors, as the Python
// layer gives them): flash_attn2 (the wgmma forward writing O and LSE itself, dK / dV from its kernels;
// with sinks and packed documents) and cudnn (straight into the views), causal and not, against f64.
TEST(BackwardInto, TheCallersViewsMatchTheReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const std::string& name : flash_and_cudnn())
    for (bool causal : {false, true}) {
      SCOPED_TRACE(name + (causal ? " causal" : ""));
      Options opt;
      opt.causal = causal;
      opt.sinks = opt.segments = name == "flash_attn2";
      ProblemSpec spec{1, 331, 403, 8, 4, 128, 128, DType::kBF16, opt, 950 + uint64_t(causal)};
      spec.segment_ids = SegmentIds::kPacked;
      DeviceGradProblem setup(spec, spec.seed);
      auto& [problem, host_in, dev, d_o, d_o_device] = setup;
      auto impl = AttentionRegistry::builtin().create(name, Backend::kCuda);
      const TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
      const Tensor o(spec.dtype, {1, spec.q_len, spec.q_heads, spec.v_head_dim}, MemoryKind::kCuda);
      const Tensor lse(DType::kF32, {1, spec.q_heads, spec.q_len}, MemoryKind::kCuda);
      const Tensor dq(spec.dtype, dev.inputs.q.shape(), MemoryKind::kCuda);
      const Tensor dk(spec.dtype, dev.inputs.k.shape(), MemoryKind::kCuda), dv(spec.dtype, dev.inputs.v.shape(), MemoryKind::kCuda);
      const GradViews into{dq.view(), dk.view(), dv.view(), {}};
      Gradients g;
      try {
        impl->forward_into(dev.inputs, problem.params(), pos, ForwardViews{o.view(), lse.view()});
        g = impl->backward(dev.inputs, problem.params(), pos, d_o_device, ForwardViews{o.view(), lse.view()}, false, &into);
      } catch (const Error& e) {
        if (e.message().find("does not run it on this GPU") != std::string::npos) GTEST_SKIP() << e.message();
        throw;
      }
      RA_CUDA_CHECK(cudaDeviceSynchronize());
      const ReferenceOutput ref_out = reference_attention_f64(host_in, problem.params(), pos);
      const Comparison out = compare(to_memory(o, MemoryKind::kHost), to_memory(lse, MemoryKind::kHost), ref_out,
                                     output_tolerance(spec.dtype, max_abs_value(host_in.v)), kLseTolerance);
      EXPECT_EQ(out.nan, 0);
      EXPECT_EQ(out.wrong, 0) << "o / lse: max |error| " << out.max_abs_error << ", LSE " << out.max_lse_error;
      const ReferenceGradients ref = reference_attention_backward_f64(host_in, problem.params(), pos, d_o);
      for (auto [got, want, what] : {std::tuple{&dq, &ref.dq, "dq"}, std::tuple{&dk, &ref.dk, "dk"}, std::tuple{&dv, &ref.dv, "dv"}}) {
        const GradientComparison cmp = compare_gradient(to_memory(*got, MemoryKind::kHost), *want, spec.dtype);
        EXPECT_EQ(cmp.nan, 0) << what;
        EXPECT_EQ(cmp.wrong, 0) << what << ": max |error| " << cmp.max_abs_error;
      }
      if (host_in.sinks.defined()) {
        const GradientComparison cmp =
            compare_gradient(to_memory(g.dsinks, MemoryKind::kHost), ref.dsinks, spec.dtype, &ref.dsinks_terms);
        EXPECT_EQ(cmp.wrong, 0) << "dsinks: max |error| " << cmp.max_abs_error;
      }
    }
}

// dK and dV into the caller's views inside larger buffers: each view's rows and columns written, and nothing around
// them. Key blocks past the last key (kv_len 203: 75 keys of the last 128), head dims narrower than their kernel
// instance (80 on the 128-column one), and views at 16-byte aligned addresses (written by the kernels: the wgmma
// kernels store them by the TMA unit) and at addresses 2 bytes past one (through the accumulators: on main before
// this test, flash_attn2's kernels stopped there with a misaligned address).
TEST(BackwardInto, KeyGradientsStayInsideTheirViews) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr std::pair<int, bool> kCases[] = {{80, false}, {128, false}, {128, true}};  // head_dim, views misaligned
  for (const std::string& name : flash_and_cudnn())
    for (const auto& [head_dim, misaligned] : kCases) {
      SCOPED_TRACE(name + " head_dim " + std::to_string(head_dim) + (misaligned ? ", views 2 bytes past 16" : ""));
      Options opt;
      opt.causal = true;
      const uint64_t seed = 1170 + uint64_t(head_dim + misaligned);
      ProblemSpec spec{2, 171, 203, 4, 2, head_dim, head_dim, DType::kBF16, opt, seed};
      DeviceGradProblem setup(spec, spec.seed);
      auto& [problem, host_in, dev, d_o, d_o_device] = setup;
      auto impl = AttentionRegistry::builtin().create(name, Backend::kCuda);
      const TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
      const Tensor dq(spec.dtype, dev.inputs.q.shape(), MemoryKind::kCuda);
      // Each view 64 guard elements (plus the misalignment) into a buffer with 64 more after it.
      const int64_t size = dev.inputs.k.numel(), before = 64 + (misaligned ? 1 : 0), total = before + size + 64;
      const Tensor dk_buffer(spec.dtype, {total}, MemoryKind::kCuda), dv_buffer(spec.dtype, {total}, MemoryKind::kCuda);
      for (const Tensor* t : {&dk_buffer, &dv_buffer})
        RA_CUDA_CHECK(cudaMemset(const_cast<void*>(t->view().data()), 0x5a, t->view().nbytes()));
      auto view_in = [&](const Tensor& buffer) {
        return TensorView(static_cast<uint16_t*>(const_cast<void*>(buffer.view().data())) + before, spec.dtype,
                          dev.inputs.k.shape(), MemoryKind::kCuda);
      };
      const GradViews into{dq.view(), view_in(dk_buffer), view_in(dv_buffer), {}};
      const Tensor o(spec.dtype, {spec.batch, spec.q_len, spec.q_heads, spec.v_head_dim}, MemoryKind::kCuda);
      const Tensor lse(DType::kF32, {spec.batch, spec.q_heads, spec.q_len}, MemoryKind::kCuda);
      try {
        impl->forward_into(dev.inputs, problem.params(), pos, ForwardViews{o.view(), lse.view()});
        impl->backward(dev.inputs, problem.params(), pos, d_o_device, ForwardViews{o.view(), lse.view()}, false, &into);
      } catch (const Error& e) {
        if (e.message().find("does not run it on this GPU") != std::string::npos) GTEST_SKIP() << e.message();
        throw;
      }
      RA_CUDA_CHECK(cudaDeviceSynchronize());
      const ReferenceGradients ref = reference_attention_backward_f64(host_in, problem.params(), pos, d_o);
      for (auto [buffer, want, what] : {std::tuple{&dk_buffer, &ref.dk, "dk"}, std::tuple{&dv_buffer, &ref.dv, "dv"}}) {
        const Tensor host = to_memory(buffer->view(), MemoryKind::kHost);
        const auto* bits = static_cast<const uint16_t*>(host.view().data());
        int64_t guards_changed = 0;
        for (int64_t i = 0; i < total; ++i)
          if ((i < before || i >= before + size) && bits[i] != 0x5a5a) ++guards_changed;
        EXPECT_EQ(guards_changed, 0) << what << ": elements written outside the view";
        const Tensor got = to_memory(view_in(*buffer), MemoryKind::kHost);
        const GradientComparison cmp = compare_gradient(got, *want, spec.dtype);
        EXPECT_EQ(cmp.nan, 0) << what;
        EXPECT_EQ(cmp.wrong, 0) << what << ": max |error| " << cmp.max_abs_error;
      }
    }
}

// Views whose one-element dimensions carry strides the GPU kernels cannot map (a batch of one at stride 0, one K/V
// head at stride 0 or 3: PyTorch keeps a broadcast's 0 there through contiguous()) run as their contiguous views do:
// O and LSE the same bits, the gradients against the f64 reference. A view takes the contiguous stride in such a
// dimension (TensorView); before that, flash_attn2 refused v (strides in 8s) and its wgmma kernels could not map q to
// the TMA unit.
TEST(OneElementDimensions, RunAsTheirContiguousViews) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const std::string& name : flash_and_cudnn()) {
    SCOPED_TRACE(name);
    Options opt;
    opt.causal = true;
    ProblemSpec spec{1, 171, 203, 4, 1, 128, 128, DType::kBF16, opt, 1190};
    DeviceGradProblem setup(spec, spec.seed);
    auto& [problem, host_in, dev, d_o, d_o_device] = setup;
    auto impl = AttentionRegistry::builtin().create(name, Backend::kCuda);
    const TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
    auto restrided = [](const TensorView& t, std::initializer_list<std::pair<int, int64_t>> strides) {
      std::array<int64_t, kMaxRank> s = t.strides();
      for (auto [dim, stride] : strides) s[dim] = stride;
      return TensorView(t.data(), t.dtype(), t.shape(), s, t.memory());
    };
    AttentionInputs odd = dev.inputs;
    odd.q = restrided(dev.inputs.q, {{0, 0}});
    odd.k = restrided(dev.inputs.k, {{0, 0}, {2, 0}});
    odd.v = restrided(dev.inputs.v, {{0, 0}, {2, 3}});
    const Tensor o(spec.dtype, {spec.batch, spec.q_len, spec.q_heads, spec.v_head_dim}, MemoryKind::kCuda);
    const Tensor lse(DType::kF32, {spec.batch, spec.q_heads, spec.q_len}, MemoryKind::kCuda);
    Tensor want_o, want_lse;  // the contiguous views' results, on the host
    Gradients g;
    try {
      impl->forward_into(dev.inputs, problem.params(), pos, ForwardViews{o.view(), lse.view()});
      want_o = to_memory(o.view(), MemoryKind::kHost), want_lse = to_memory(lse.view(), MemoryKind::kHost);
      impl->forward_into(odd, problem.params(), pos, ForwardViews{o.view(), lse.view()});
      g = impl->backward(odd, problem.params(), pos, d_o_device, ForwardViews{o.view(), lse.view()});
      RA_CUDA_CHECK(cudaDeviceSynchronize());
    } catch (const Error& e) {
      if (e.message().find("does not run it on this GPU") != std::string::npos) GTEST_SKIP() << e.message();
      throw;
    }
    EXPECT_TRUE(same_bits(o.view(), want_o.view())) << "o differs from the contiguous views' o";
    EXPECT_TRUE(same_bits(lse.view(), want_lse.view())) << "lse differs from the contiguous views' lse";
    const ReferenceGradients ref = reference_attention_backward_f64(host_in, problem.params(), pos, d_o);
    for (auto [got, want, what] : {std::tuple{&g.dq, &ref.dq, "dq"}, std::tuple{&g.dk, &ref.dk, "dk"},
                                   std::tuple{&g.dv, &ref.dv, "dv"}}) {
      const GradientComparison cmp = compare_gradient(to_memory(got->view(), MemoryKind::kHost), *want, spec.dtype);
      EXPECT_EQ(cmp.nan, 0) << what;
      EXPECT_EQ(cmp.wrong, 0) << what << ": max |error| " << cmp.max_abs_error;
    }
  }
}

// --deterministic: the gradients are the same bits on every run (flash_attn2 on wgmma: each block of query
// rows takes its dQ adds from the key blocks in a fixed order, or at exact D = 192 / 256 from the query-block
// kernel alone; on mma.sync the key blocks in rounds, dQ of
// each block of a round into a slice of its own, summed in order; cudnn: its deterministic algorithm) and
// still match the f64 reference. Shapes of more key blocks than a round holds; every instance of the
// wgmma kernel; the extras with a bias of full shape (dBias has one writer per element).
TEST(DeterministicBackward, SameBitsOnEveryRun) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  struct Case {
    std::string impl;
    FlashKernel kernel;
    ProblemSpec spec;
  };
  Options plain, causal_window, extras, causal, documents, capped, capped_documents;
  causal_window.causal = causal_window.window = true;
  extras.bias = extras.dropout = extras.segments = true;
  causal.causal = true;
  documents.segments = documents.causal = true;
  capped.softcap = capped.window = true;
  capped_documents.softcap = capped_documents.segments = capped_documents.causal = true;
  std::vector<Case> cases;
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync}) {
    cases.push_back({"flash_attn2", kernel, {1, 1200, 2100, 4, 1, 64, 64, DType::kBF16, plain, 960}});
    cases.push_back({"flash_attn2", kernel, {1, 1500, 2100, 8, 2, 128, 128, DType::kF16, causal_window, 961}});
    cases.push_back({"flash_attn2", kernel, {1, 700, 1100, 2, 1, 256, 256, DType::kBF16, extras, 962}});
    cases.push_back({"flash_attn2", kernel, {1, 900, 1300, 4, 2, 192, 128, DType::kBF16, causal, 964}});
    cases.push_back({"flash_attn2", kernel, {1, 1100, 1700, 4, 2, 96, 96, DType::kBF16, causal, 968}});
    // Exact 192 / 256 on positions: dQ by the query-block kernel (one writer per element).
    cases.push_back({"flash_attn2", kernel, {1, 900, 1300, 4, 2, 192, 192, DType::kBF16, causal_window, 969}});
    cases.push_back({"flash_attn2", kernel, {2, 700, 600, 2, 1, 256, 256, DType::kF16, causal, 970}});
    // Packed documents (the walk skips query blocks); a soft cap with a window over 37 key blocks (the
    // ordered kernel's writer masks span two words).
    cases.push_back({"flash_attn2", kernel, {2, 1000, 1000, 4, 2, 128, 128, DType::kBF16, documents, 966}});
    cases.push_back({"flash_attn2", kernel, {1, 600, 4700, 4, 1, 64, 64, DType::kF16, capped, 967}});
    // A soft cap beside packed documents (the ordered kernel's soft-cap instance with segment ids).
    cases.push_back({"flash_attn2", kernel, {1, 900, 1500, 4, 2, 64, 64, DType::kBF16, capped_documents, 971}});
  }
#if RA_HAVE_CUDNN
  cases.push_back({"cudnn", FlashKernel::kAuto, {1, 1500, 2100, 4, 1, 128, 128, DType::kBF16, causal, 963}});
  cases.push_back({"cudnn", FlashKernel::kAuto, {1, 900, 1300, 4, 2, 192, 128, DType::kBF16, causal, 965}});
#endif
  for (const Case& c : cases) {
    SCOPED_TRACE(c.impl + " " + flash_kernel_name(c.kernel) + " D=" + std::to_string(c.spec.head_dim) + " Dv=" +
                 std::to_string(c.spec.v_head_dim) + " " + c.spec.options.name());
    if (c.kernel == FlashKernel::kWgmma && !flash_wgmma_available()) continue;
    DeviceGradProblem setup(c.spec, c.spec.seed);
    auto& [problem, host_in, dev, d_o, d_o_device] = setup;
    AttentionParams params = problem.params();
    params.flash_kernel = c.kernel;
    params.deterministic = true;
    auto impl = AttentionRegistry::builtin().create(c.impl, Backend::kCuda);
    std::vector<std::vector<Tensor>> runs;
    try {
      for (int run = 0; run < 3; ++run) {
        Gradients g = impl->backward(dev.inputs, params, d_o_device);
        RA_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<Tensor>& got = runs.emplace_back();
        for (const Tensor* t : {&g.dq, &g.dk, &g.dv, &g.dbias})
          if (t->defined()) got.push_back(to_memory(*t, MemoryKind::kHost));
      }
    } catch (const Error& e) {
      if (e.message().find("does not run it on this GPU") != std::string::npos) continue;
      throw;
    }
    const char* names[] = {"dq", "dk", "dv", "dbias"};
    for (int run = 1; run < 3; ++run)
      for (size_t i = 0; i < runs[0].size(); ++i)
        EXPECT_TRUE(same_bits(runs[0][i].view(), runs[size_t(run)][i].view()))
            << names[i] << " of run " << run << " differs from run 0";
    const ReferenceGradients ref = reference_attention_backward_f64(
        host_in, params, TokenPositions::dense(c.spec.q_len, c.spec.kv_len), d_o);
    const std::vector<double>* want[] = {&ref.dq, &ref.dk, &ref.dv, &ref.dbias};
    for (size_t i = 0; i < runs[0].size(); ++i) {
      const GradientComparison cmp = compare_gradient(runs[0][i], *want[i], c.spec.dtype);
      EXPECT_EQ(cmp.nan, 0) << names[i];
      EXPECT_EQ(cmp.wrong, 0) << names[i] << ": max |error| " << cmp.max_abs_error << " (tolerance " << cmp.tolerance << ")";
    }
  }
}

#if RA_HAVE_CUDNN
// cudnn's backward over the keys cut into parts, as the GPU ring cuts its own block (half the keys at
// its first step, half at its last): parts whose causal diagonal cuDNN cannot express as one block
// (queries starting before the keys, keys starting before the queries off the bottom-right diagonal)
// are computed in parts it can. The summed gradients match the f64 reference over all the keys.
TEST(CudnnBackward, KeyPartsOfAnyDiagonalSumToTheReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  struct Split {
    int64_t t, s;
    std::vector<int64_t> cuts;
    int64_t d = 64, dv = 64;
  };
  for (const Split& split : {Split{200, 200, {100}}, Split{100, 200, {150}}, Split{96, 160, {40, 70, 130}},
                             Split{100, 200, {150}, 192, 128}}) {
    SCOPED_TRACE("T=" + std::to_string(split.t) + " S=" + std::to_string(split.s) + " D=" + std::to_string(split.d) +
                 " Dv=" + std::to_string(split.dv));
    Options causal;
    causal.causal = true;
    const ProblemSpec spec{1, split.t, split.s, 4, 2, split.d, split.dv, DType::kBF16, causal, 900 + uint64_t(split.t)};
    DeviceGradProblem setup(spec, spec.seed);
    auto& [problem, host_in, dev, d_o, d_o_device] = setup;
    auto impl = AttentionRegistry::builtin().create("cudnn", Backend::kCuda);
    const TokenPositions all = TokenPositions::dense(spec.q_len, spec.kv_len);
    const AttentionOutput out = impl->forward(dev.inputs, problem.params(), all);
    const Tensor delta = compute_delta(out.o, d_o_device, TensorView(), impl->cuda_stream());
    GradAccumulators acc = GradAccumulators::zeros(dev.inputs, MemoryKind::kCuda);
    std::vector<int64_t> bounds = split.cuts;
    bounds.insert(bounds.begin(), 0);
    bounds.push_back(spec.kv_len);
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      const int64_t first = bounds[i], count = bounds[i + 1] - bounds[i];
      AttentionInputs part = dev.inputs;
      part.k = narrow(dev.inputs.k, 1, first, count);
      part.v = narrow(dev.inputs.v, 1, first, count);
      TokenPositions pos = all;
      pos.k.assign(all.k.begin() + first, all.k.begin() + first + count);
      const GradViews views{acc.dq, narrow(acc.dk, 1, first, count), narrow(acc.dv, 1, first, count), {}};
      impl->accumulate_backward(part, pos, problem.params(), BackwardInputs{out.lse, d_o_device, delta, out.o}, views);
    }
    RA_CUDA_CHECK(cudaDeviceSynchronize());
    const ReferenceGradients ref = reference_attention_backward_f64(host_in, problem.params(), all, d_o);
    for (auto [got, want, name] : {std::tuple{&acc.dq, &ref.dq, "dq"}, std::tuple{&acc.dk, &ref.dk, "dk"},
                                   std::tuple{&acc.dv, &ref.dv, "dv"}}) {
      const GradientComparison cmp = compare_gradient(to_memory(*got, MemoryKind::kHost), *want, spec.dtype);
      EXPECT_EQ(cmp.nan, 0) << name;
      EXPECT_EQ(cmp.wrong, 0) << name << ": max |error| " << cmp.max_abs_error << " (tolerance " << cmp.tolerance
                              << ")";
    }
  }
}

// Where the caller lets cudnn write dK / dV over (GradViews::kv_unset: the GPU ring's unzeroed partials), the
// rows a call covers first are written, later calls' added, rows no query sees zeroed: the gradients over NaN
// garbage equal those added into zeros, bit for bit. The shard's calls cut a key run into spans (at B = 2 a
// span's rows go one batch at a time), and one key run no query sees.
TEST(CudnnBackward, UnsetKeyRowsWrittenOverEqualAddsIntoZeros) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Options causal;
  causal.causal = true;
  const ProblemSpec spec{2, 70, 80, 4, 2, 64, 64, DType::kBF16, causal, 991};
  DeviceGradProblem setup(spec, spec.seed);
  auto& [problem, host_in, dev, d_o, d_o_device] = setup;
  auto positions = [](std::initializer_list<std::pair<int64_t, int64_t>> runs) {
    std::vector<int64_t> out;
    for (const auto& [first, end] : runs)
      for (int64_t p = first; p < end; ++p) out.push_back(p);
    return out;
  };
  TokenPositions pos;
  pos.q = positions({{70, 100}, {120, 160}});
  pos.k = positions({{40, 80}, {150, 170}, {200, 220}});  // the last run: after every query
  pos.total_keys = 220;
  auto impl = AttentionRegistry::builtin().create("cudnn", Backend::kCuda);
  const AttentionOutput out = impl->forward(dev.inputs, problem.params(), pos);
  const Tensor delta = compute_delta(out.o, d_o_device, TensorView(), impl->cuda_stream());
  const BackwardInputs grad{out.lse, d_o_device, delta, out.o};
  GradAccumulators added = GradAccumulators::zeros(dev.inputs, MemoryKind::kCuda);
  impl->accumulate_backward(dev.inputs, pos, problem.params(), grad, added.views());
  GradAccumulators written = GradAccumulators::zeros(dev.inputs, MemoryKind::kCuda);
  for (const Tensor* t : {&written.dk, &written.dv})
    RA_CUDA_CHECK(cudaMemset(const_cast<void*>(t->view().data()), 0xff, t->view().nbytes()));  // f32 NaN
  GradViews views = written.views();
  views.kv_unset = true;
  impl->accumulate_backward(dev.inputs, pos, problem.params(), grad, views);
  RA_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto [a, b, name] : {std::tuple{&added.dq, &written.dq, "dq"}, std::tuple{&added.dk, &written.dk, "dk"},
                            std::tuple{&added.dv, &written.dv, "dv"}}) {
    EXPECT_TRUE(same_bits(b->view(), a->view())) << name << " differs";
    const std::vector<float> want = as_f32(a->view());
    EXPECT_GT(*std::max_element(want.begin(), want.end()), 0.0f) << name;
  }
}

// Blocks longer than one cuDNN call's scratch allows: the accumulating backward (the ring's) cuts its calls into
// chunks of about 1 GiB of scratch a side (43690 query rows and 65536 key rows at H = 32, D = 128, bf16: here two
// of each, their causal diagonals cut into parts), and its gradients match one direct call's over the whole block.
// (An f64 reference at 70000 tokens is out of reach; the two paths share no chunk, and a part missed or added
// twice moves the gradients by far more than bf16's rounding.) The inputs are a random tile repeated along T.
TEST(CudnnBackward, ChunkedLongBlocksMatchOneDirectCall) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 70000, H = 32, D = 128, tile = 700;
  std::mt19937_64 rng(977);
  auto tiled = [&] {
    const Tensor host = random_normal(DType::kBF16, {1, tile, H, D}, rng, 1.0f);
    Tensor device(DType::kBF16, {1, T, H, D}, MemoryKind::kCuda);
    const size_t bytes = size_t(host.view().nbytes());
    for (int64_t at = 0; at < T; at += tile)
      RA_CUDA_CHECK(cudaMemcpy(device.data<char>() + size_t(at / tile) * bytes, host.data<char>(), bytes,
                               cudaMemcpyHostToDevice));
    return device;
  };
  const Tensor q = tiled(), k = tiled(), v = tiled(), d_o = tiled();
  AttentionInputs in;
  in.q = q.view(), in.k = k.view(), in.v = v.view();
  const TokenPositions pos = TokenPositions::dense(T, T);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    AttentionParams params;
    params.causal = causal;
    auto impl = AttentionRegistry::builtin().create("cudnn", Backend::kCuda);
    const AttentionOutput out = impl->forward(in, params, pos);
    const Gradients direct = impl->backward(in, params, pos, d_o, ForwardViews{out.o.view(), out.lse.view()});
    const Tensor delta = compute_delta(out.o, d_o, TensorView(), impl->cuda_stream());
    GradAccumulators acc = GradAccumulators::zeros(in, MemoryKind::kCuda);
    impl->accumulate_backward(in, pos, params, BackwardInputs{out.lse, d_o, delta, out.o}, acc.views());
    RA_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto [chunked, whole, name] : {std::tuple{&acc.dq, &direct.dq, "dq"}, std::tuple{&acc.dk, &direct.dk, "dk"},
                                        std::tuple{&acc.dv, &direct.dv, "dv"}}) {
      const std::vector<float> got = as_f32(chunked->view()), want = as_f32(whole->view());
      ASSERT_EQ(got.size(), want.size()) << name;
      double max_error = 0, max_want = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        max_error = std::max(max_error, double(std::abs(got[i] - want[i])));
        max_want = std::max(max_want, double(std::abs(want[i])));
      }
      EXPECT_GT(max_want, 0.0) << name;
      EXPECT_LE(max_error, 2e-2 * max_want) << name << ": max |chunked - direct| " << max_error << ", max |direct| "
                                           << max_want;
    }
  }
}
#endif

}  // namespace
}  // namespace ra::test
