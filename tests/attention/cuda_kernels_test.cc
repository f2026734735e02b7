// The CUDA implementations against the f64 reference (on the host) on randomised shapes: odd
// lengths, S != T, several K/V tiles with a partial last one, GQA, every option alone and combined;
// plus the device carry operations against the host ones. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>

#include "attention/carry.h"
#include "attention/cuda/carry_cuda.h"
#include "attention/ring/block_checksum.h"
#include "attention/cuda/cuda_attention.h"
#include "attention/cuda/flash_cuda.h"
#include "attention/cuda/flash_wgmma.h"
#include "attention/cuda/mask_tiles.h"
#include "attention/registry.h"
#include "runtime/cuda_device.h"
#include "runtime/memory.h"
#include "runtime/random.h"
#include "tests/support/cudnn_head_dims.h"
#include "tests/support/flash_kernel_choice.h"
#include "tests/support/problem.h"

namespace ra::test {
namespace {

#define RA_REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

struct CudaCase {
  std::string impl;
  ProblemSpec spec;
  FlashKernel kernel = FlashKernel::kAuto;  // flash_attn2 only
};

std::vector<CudaCase> all_cases() {
  struct Shape {
    int64_t b, t, s, hq, hkv, d;
  };
  // T and S cross the 128-row and 64-key tiles; one query row (decode); GQA 1, 2, 4, 8.
  const Shape shapes[] = {{2, 77, 77, 4, 4, 64},     {1, 131, 203, 8, 4, 128}, {1, 300, 517, 4, 1, 64},
                          {1, 257, 130, 8, 1, 128},  {2, 1, 97, 8, 2, 64},     {1, 190, 190, 2, 2, 128}};
  std::vector<CudaCase> cases;
  uint64_t seed = 100;
  for (const char* impl : {"flash_attn2", "sdpa"})
    for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
      if (dtype == DType::kF32 && std::string(impl) == "flash_attn2") continue;  // tensor cores: 16-bit inputs
      for (const Options& opt : option_sets()) {
        const Shape& sh = shapes[seed % std::size(shapes)];
        cases.push_back({impl, ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}});
      }
    }
  // Both flash kernels forced on positions and segment ids, every shape.
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
    for (DType dtype : {DType::kF16, DType::kBF16})
      for (const Options& opt : wgmma_option_sets())
        for (int repeat = 0; repeat < 2; ++repeat) {
          const Shape& sh = shapes[seed % std::size(shapes)];
          cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}, kernel});
        }
  // head_dim 256: every option set with `auto` (on a Hopper wgmma's 64-key tiles), both dtypes; each kernel
  // forced on positions and segment ids; packed documents.
  const Shape wide[] = {{1, 131, 203, 4, 2, 256}, {2, 70, 70, 2, 2, 256}, {1, 257, 130, 4, 1, 256}};
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (const Options& opt : option_sets()) {
      const Shape& sh = wide[seed % std::size(wide)];
      cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}});
    }
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
    for (const Options& opt : wgmma_option_sets()) {
      const Shape& sh = wide[seed % std::size(wide)];
      cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, DType::kBF16, opt, seed++}, kernel});
    }
  for (const DocumentCase& c : document_cases({{1, 520, 520, 2, 1, 256}}, seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  // A soft cap on each kernel forced (their instances of their own, with segment ids too), every head dim.
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
    for (const Shape& sh : {shapes[1], shapes[2], wide[0], shapes[3], shapes[4], wide[1]})
      for (const Options& opt : soft_cap_option_sets()) {
        const DType dtype = seed % 2 ? DType::kBF16 : DType::kF16;
        cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}, kernel});
      }
  // The extras instances (bias, mask, dropout, a soft cap beside a mask) on each kernel forced, D 64 / 128 /
  // 256.
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
    for (const Options& opt : extras_option_sets())
      for (const Shape& sh : {shapes[seed % 2 ? 2 : 0], shapes[seed % 2 ? 1 : 3], wide[seed % std::size(wide)]}) {
        const DType dtype = seed % 2 ? DType::kBF16 : DType::kF16;
        cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}, kernel});
      }
  // The wgmma forward's bias and mask instances (alone_cases), each kernel forced.
  for (bool Options::* extra : {&Options::bias, &Options::mask})
    for (const DocumentCase& c : alone_cases(extra, seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  // The mask instances on masks of documents, whole tiles hidden and kept (mask_tile_cases).
  for (const DocumentCase& c : mask_tile_cases(seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  // Packed and cycled documents on shapes of many 64- and 128-row blocks: key tiles that share no
  // document with a query block are skipped, tiles inside one run unmasked, the rest compare ids; each
  // kernel forced without the extras and with them (document_cases).
  for (const DocumentCase& c :
       document_cases({{1, 700, 700, 4, 2, 128}, {2, 333, 600, 4, 4, 64}, {1, 520, 520, 2, 1, 64}}, seed))
    cases.push_back({"flash_attn2", c.spec, c.kernel});
  // Head dims between the instances and Dv != D (padded_head_dim_cases).
  std::vector<std::array<int64_t, 5>> padded_shapes;
  for (const Shape& sh : shapes) padded_shapes.push_back({sh.b, sh.t, sh.s, sh.hq, sh.hkv});
  for (const DocumentCase& c : padded_head_dim_cases(padded_shapes, seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  // The wgmma forward's instance of 192 columns (96-key tiles, O formed by wgmma of 128 and 64 columns):
  // exact 192 and, in turn, the dims it serves (MLA's 192 / 128, those between 128 and 192) on every option
  // set the kernel runs, both dtypes, GQA, T = 1, several key tiles with a partial last one.
  const Shape tiles96[] = {{1, 257, 330, 8, 2, 0}, {2, 1, 97, 4, 4, 0}, {1, 190, 290, 4, 1, 0}, {1, 133, 203, 8, 4, 0}};
  const std::pair<int64_t, int64_t> dims192[] = {{192, 128}, {160, 160}, {136, 176}, {144, 192}, {192, 136}};
  for (const Options& opt : every_instance_option_set())
    for (const auto& [d, dv] : {std::pair<int64_t, int64_t>{192, 192}, dims192[seed % std::size(dims192)]}) {
      const Shape& sh = tiles96[seed % std::size(tiles96)];
      const DType dtype = seed % 2 ? DType::kBF16 : DType::kF16;
      cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, d, dv, dtype, opt, seed++}, FlashKernel::kWgmma});
    }
  // MLA's instance (D = 192, Dv = 128: V and O of 128 columns, 128-key tiles) and the dims it serves (D above
  // 128, Dv up to 128), on every option set, both dtypes, each case against the f64 reference.
  const std::pair<int64_t, int64_t> dims_mla[] = {{192, 128}, {160, 128}, {136, 64}, {184, 120}, {192, 32}};
  for (const Options& opt : every_instance_option_set())
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      const auto& [d, dv] = dims_mla[seed % std::size(dims_mla)];
      const Shape& sh = tiles96[seed % std::size(tiles96)];
      cases.push_back({"flash_attn2", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, d, dv, dtype, opt, seed++},
                       FlashKernel::kWgmma});
    }
#if RA_HAVE_CUDNN
  // cudnn: the options it expresses (causal with S >= T, sinks through our finalize), GQA, D 64 / 128 /
  // 256 (where the installed cuDNN runs it, e.g. Hopper; elsewhere its refusal, by name, skips the case).
  const Shape cudnn_shapes[] = {{2, 77, 77, 4, 4, 64}, {1, 131, 203, 8, 4, 128}, {1, 300, 517, 4, 1, 64},
                                {2, 1, 97, 8, 2, 128},  {1, 133, 257, 4, 2, 256}, {2, 64, 64, 2, 1, 256}};
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (int o = 0; o < 6; ++o) {
      Options opt;
      opt.causal = o % 2 == 1;
      opt.sinks = o >= 2;
      const Shape& sh = cudnn_shapes[seed % std::size(cudnn_shapes)];
      cases.push_back({"cudnn", ProblemSpec{sh.b, sh.t, sh.s, sh.hq, sh.hkv, sh.d, sh.d, dtype, opt, seed++}});
    }
  // cudnn, causal with T > S: the first T - S rows see no key (0 and LSE -inf), the call is not one
  // whole cuDNN block, so it goes through the carry rather than cuDNN's O and LSE written directly.
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    Options opt;
    opt.causal = true;
    cases.push_back({"cudnn", ProblemSpec{1, 203, 131, 4, 2, 128, 128, dtype, opt, seed++}});
  }
  // cudnn with v_head_dim != head_dim (MLA's 192 / 128 and others), each option it expresses.
  for (const ProblemSpec& spec : cudnn_head_dim_cases(seed)) cases.push_back({"cudnn", spec});
#endif
  // The wgmma forward's dropout instances (alone_cases: each row's key formed once), each kernel forced.
  for (const DocumentCase& c : alone_cases(&Options::dropout, seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  // And beside packed, cycled and long documents (dropout_document_cases).
  for (const DocumentCase& c : dropout_document_cases(seed)) cases.push_back({"flash_attn2", c.spec, c.kernel});
  return cases;
}

void PrintTo(const CudaCase& c, std::ostream* os) {
  *os << c.impl << "/" << dtype_name(c.spec.dtype) << "/" << flash_kernel_name(c.kernel);
}

class CudaVsReference : public testing::TestWithParam<CudaCase> {};

TEST_P(CudaVsReference, MatchesF64Reference) {
  RA_REQUIRE_GPU();
  const CudaCase& c = GetParam();
  if (c.kernel == FlashKernel::kWgmma && !flash_wgmma_available()) GTEST_SKIP() << "no sm_90a code or not a Hopper GPU";
  Problem problem(c.spec);
  problem.params().flash_kernel = c.kernel;
  const AttentionInputs host_in = problem.inputs();
  const InputsCopy device_in = copy_inputs(host_in, MemoryKind::kCuda);
  auto impl = AttentionRegistry::builtin().create(c.impl, Backend::kCuda);
  AttentionOutput out;
  try {
    out = impl->forward(device_in.inputs, problem.params());
  } catch (const Error& e) {
    if (c.impl == "cudnn" && e.message().find("does not run it on this GPU") != std::string::npos) GTEST_SKIP() << e.message();
    throw;
  }
  RA_CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor o = to_memory(out.o, MemoryKind::kHost), lse = to_memory(out.lse, MemoryKind::kHost);
  ReferenceOutput ref = reference_attention_f64(host_in, problem.params(), TokenPositions::dense(c.spec.q_len, c.spec.kv_len));
  const double scale = c.spec.options.dropout ? 1.0 / (1.0 - problem.params().dropout_prob) : 1.0;
  const double tol = output_tolerance(c.spec.dtype, max_abs_value(host_in.v) * scale);
  const Comparison cmp = compare(o, lse, ref, tol, kLseTolerance);
  EXPECT_EQ(cmp.nan, 0);
  EXPECT_EQ(cmp.wrong, 0) << "max |error| " << cmp.max_abs_error << " (tolerance " << tol << "), max LSE error "
                          << cmp.max_lse_error;
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaVsReference, testing::ValuesIn(all_cases()), [](const auto& info) {
  const CudaCase& c = info.param;
  const ProblemSpec& s = c.spec;
  const std::string kernel = c.kernel == FlashKernel::kAuto ? "" : std::string("_") + flash_kernel_name(c.kernel);
  const std::string dv = s.v_head_dim == s.head_dim ? "" : "_Dv" + std::to_string(s.v_head_dim);
  return c.impl + kernel + "_" + std::string(dtype_name(s.dtype)) + "_" + s.options.name() + segment_ids_suffix(s.segment_ids) +
         "_T" + std::to_string(s.q_len) + "_S" + std::to_string(s.kv_len) + "_D" + std::to_string(s.head_dim) + dv + "_G" +
         std::to_string(s.q_heads / s.kv_heads);
});

// Carry in / carry out: two accumulate calls over the halves of the keys equal one call over all.
// Also at head dims between the instances and Dv != D (the carry holds Dv columns), each kernel forced.
TEST(CudaFlash, SplitKeysThroughTheCarryEqualsOneCall) {
  RA_REQUIRE_GPU();
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
    for (auto [d, dv] : {std::pair<int64_t, int64_t>{128, 128}, {192, 128}, {80, 80}, {64, 96}}) {
      SCOPED_TRACE(std::string(flash_kernel_name(kernel)) + " D=" + std::to_string(d) + " Dv=" + std::to_string(dv));
      if (kernel == FlashKernel::kWgmma && !flash_wgmma_available()) continue;
      ProblemSpec spec{1, 200, 300, 4, 2, d, dv, DType::kBF16, Options{true, false, false, false, false, false, false, false}, 7};
      Problem p(spec);
      AttentionParams params = p.params();
      params.flash_kernel = kernel;
      const InputsCopy dev = copy_inputs(p.inputs(), MemoryKind::kCuda);
      auto flash = AttentionRegistry::builtin().create("flash_attn2", Backend::kCuda);
      const TokenPositions all = TokenPositions::dense(spec.q_len, spec.kv_len);
      Carry whole = Carry::empty(1, 4, spec.q_len, dv, MemoryKind::kCuda), split = Carry::empty(1, 4, spec.q_len, dv, MemoryKind::kCuda);
      flash->accumulate(dev.inputs, all, params, whole);
      for (int64_t start : {int64_t(0), int64_t(130)}) {
        const int64_t len = start == 0 ? 130 : spec.kv_len - 130;
        AttentionInputs part = dev.inputs;
        part.k = narrow(dev.inputs.k, 1, start, len);
        part.v = narrow(dev.inputs.v, 1, start, len);
        TokenPositions pos = all;
        pos.k.assign(all.k.begin() + start, all.k.begin() + start + len);
        flash->accumulate(part, pos, params, split);
      }
      RA_CUDA_CHECK(cudaDeviceSynchronize());
      const Tensor a = to_memory(whole.numerator, MemoryKind::kHost), b = to_memory(split.numerator, MemoryKind::kHost);
      const Tensor la = to_memory(whole.denominator, MemoryKind::kHost), lb = to_memory(split.denominator, MemoryKind::kHost);
      const Tensor ma = to_memory(whole.max, MemoryKind::kHost), mb = to_memory(split.max, MemoryKind::kHost);
      double worst = 0;
      for (int64_t r = 0; r < whole.row_count(); ++r) {
        // Compare normalised rows: the carries may hold different running maxima only through rounding.
        const float na = la.data<float>()[r], nb = lb.data<float>()[r];
        // The running maxima agree up to the kernel's log2 <-> natural-log unit conversion.
        ASSERT_NEAR(ma.data<float>()[r], mb.data<float>()[r], 1e-6f * std::fabs(ma.data<float>()[r]) + 1e-7f) << "row " << r;
        for (int64_t c = 0; c < dv; ++c)
          worst = std::max(worst, double(std::fabs(a.data<float>()[r * dv + c] / na - b.data<float>()[r * dv + c] / nb)));
      }
      EXPECT_LT(worst, 2e-2);
      // And the whole carry, finalized, against the f64 reference.
      Tensor o(DType::kF32, {1, spec.q_len, 4, dv}, MemoryKind::kCuda), lse(DType::kF32, {1, 4, spec.q_len}, MemoryKind::kCuda);
      finalize(split, TensorView(), o, lse);
      RA_CUDA_CHECK(cudaDeviceSynchronize());
      const ReferenceOutput ref = reference_attention_f64(p.inputs(), p.params(), all);
      const Comparison cmp = compare(to_memory(o, MemoryKind::kHost), to_memory(lse, MemoryKind::kHost), ref,
                                     output_tolerance(spec.dtype, max_abs_value(p.inputs().v)), kLseTolerance);
      EXPECT_EQ(cmp.nan, 0);
      EXPECT_EQ(cmp.wrong, 0) << "max |error| " << cmp.max_abs_error;
    }
}

// The ring's chain of blocks: each kernel after the first starts while the previous one runs and
// waits for it only before it merges its part into the carry. Against the f64 reference over all the
// keys (a kernel that read the carry too early would drop a block's part), as is the same chain with
// each kernel starting after the previous one.
// A problem on the device and the CUDA flash kernel on a stream of its own, for chains of blocks.
struct FlashChain {
  explicit FlashChain(const ProblemSpec& spec)
      : p(spec), host_in(p.inputs()), dev(copy_inputs(host_in, MemoryKind::kCuda)),
        impl(AttentionRegistry::builtin().create("flash_attn2", Backend::kCuda)),
        flash(dynamic_cast<CudaAttentionImpl*>(impl.get())) {
    flash->set_cuda_stream(stream.get());
  }
  Problem p;
  AttentionInputs host_in;
  InputsCopy dev;
  std::unique_ptr<AttentionImpl> impl;
  CudaAttentionImpl* flash;
  CudaStream stream;
};

TEST(CudaFlash, BlocksStartingBeforeThePreviousEndsMatchTheReference) {
  RA_REQUIRE_GPU();
  ProblemSpec spec{1, 1000, 1000, 8, 2, 128, 128, DType::kBF16, Options{}, 11};
  spec.options.causal = true;  // query blocks that see none of a later key block leave the carry alone
  FlashChain chain(spec);
  DevicePositionBuffer upload;
  const TokenPositions all = TokenPositions::dense(spec.q_len, spec.kv_len);
  const DevicePositions pos = upload.upload(all, chain.stream.get());
  const ReferenceOutput ref = reference_attention_f64(chain.host_in, chain.p.params(), all);
  for (bool overlap : {true, false}) {
    Carry carry = Carry::empty(1, spec.q_heads, spec.q_len, 128, MemoryKind::kCuda);
    reset(carry, chain.stream.get());
    constexpr int64_t kBlock = 250;
    for (int64_t start = 0; start < spec.kv_len; start += kBlock) {
      AttentionInputs block = chain.dev.inputs;
      block.k = narrow(chain.dev.inputs.k, 1, start, kBlock);
      block.v = narrow(chain.dev.inputs.v, 1, start, kBlock);
      chain.flash->set_after_carry_writer(overlap && start > 0);
      chain.flash->accumulate_device(block, pos.keys_from(start), chain.p.params(), carry);
    }
    Tensor o(spec.dtype, {1, spec.q_len, spec.q_heads, 128}, MemoryKind::kCuda);
    Tensor lse(DType::kF32, {1, spec.q_heads, spec.q_len}, MemoryKind::kCuda);
    finalize(carry, TensorView(), o, lse, chain.stream.get());
    chain.stream.synchronize();
    const Comparison cmp = compare(to_memory(o, MemoryKind::kHost), to_memory(lse, MemoryKind::kHost), ref,
                                   output_tolerance(spec.dtype, max_abs_value(chain.host_in.v)), kLseTolerance);
    EXPECT_EQ(cmp.nan, 0) << (overlap ? "overlapped" : "one after another");
    EXPECT_EQ(cmp.wrong, 0) << (overlap ? "overlapped" : "one after another") << ": max |error| " << cmp.max_abs_error
                            << ", max LSE error " << cmp.max_lse_error;
  }
}

// A kernel whose blocks all see no key (zigzag or striped ring steps under a narrow window can make
// one) still waits for the kernel before it: the kernel behind it waits only for that one, so a grid
// that ended early would let it merge while the first still writes the carry. Chain: A (long blocks,
// every key visible), B (every key in the queries' future), C (short blocks): A + C, every time.
TEST(CudaFlash, AGridOfEmptyBlocksStillOrdersTheCarryWriters) {
  RA_REQUIRE_GPU();
  const int64_t a_keys = 4096, c_keys = 256, T = 1024;
  ProblemSpec spec{1, T, a_keys + c_keys, 16, 4, 128, 128, DType::kBF16, Options{}, 17};
  spec.options.causal = true;
  FlashChain chain(spec);
  TokenPositions all;  // every query after every key of A and C
  for (int64_t i = 0; i < spec.kv_len; ++i) all.k.push_back(i);
  for (int64_t i = 0; i < T; ++i) all.q.push_back(spec.kv_len + i);
  all.total_keys = 1 << 20;
  TokenPositions future = all;  // B: C's rows at positions no query may see
  future.k.clear();
  for (int64_t i = 0; i < c_keys; ++i) future.k.push_back((1 << 19) + i);
  DevicePositionBuffer upload_all, upload_future;
  const DevicePositions pos = upload_all.upload(all, chain.stream.get());
  const DevicePositions future_pos = upload_future.upload(future, chain.stream.get());
  const ReferenceOutput ref = reference_attention_f64(chain.host_in, chain.p.params(), all);
  auto rows = [&](int64_t start, int64_t count) {
    AttentionInputs block = chain.dev.inputs;
    block.k = narrow(chain.dev.inputs.k, 1, start, count);
    block.v = narrow(chain.dev.inputs.v, 1, start, count);
    return block;
  };
  for (int round = 0; round < 5; ++round) {
    Carry carry = Carry::empty(1, spec.q_heads, T, 128, MemoryKind::kCuda);
    reset(carry, chain.stream.get());
    chain.flash->set_after_carry_writer(false);
    chain.flash->accumulate_device(rows(0, a_keys), pos, chain.p.params(), carry);
    chain.flash->set_after_carry_writer(true);
    chain.flash->accumulate_device(rows(a_keys, c_keys), future_pos, chain.p.params(), carry);
    chain.flash->accumulate_device(rows(a_keys, c_keys), pos.keys_from(a_keys), chain.p.params(), carry);
    Tensor o(spec.dtype, {1, T, spec.q_heads, 128}, MemoryKind::kCuda);
    Tensor lse(DType::kF32, {1, spec.q_heads, T}, MemoryKind::kCuda);
    finalize(carry, TensorView(), o, lse, chain.stream.get());
    chain.stream.synchronize();
    const Comparison cmp = compare(to_memory(o, MemoryKind::kHost), to_memory(lse, MemoryKind::kHost), ref,
                                   output_tolerance(spec.dtype, max_abs_value(chain.host_in.v)), kLseTolerance);
    EXPECT_EQ(cmp.nan, 0) << "round " << round;
    ASSERT_EQ(cmp.wrong, 0) << "round " << round << ": max |error| " << cmp.max_abs_error << ", max LSE error "
                            << cmp.max_lse_error;
  }
}

// The device merge / fold / finalize against the host ones, with empty rows on either side.
TEST(CudaCarry, MergeAndFinalizeMatchHost) {
  RA_REQUIRE_GPU();
  const int64_t B = 2, H = 3, T = 17, Dv = 40;
  auto random_carry = [&](uint64_t seed) {
    Carry c = Carry::empty(B, H, T, Dv);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    for (int64_t r = 0; r < c.row_count(); ++r) {
      if (r % 5 == int64_t(seed % 5)) continue;  // an empty row
      c.max.data<float>()[r] = normal(rng) * 3;
      c.denominator.data<float>()[r] = 1.0f + std::fabs(normal(rng));
      for (int64_t d = 0; d < Dv; ++d) c.numerator.data<float>()[r * Dv + d] = normal(rng);
    }
    return c;
  };
  auto to_device = [](const Carry& c) {
    Carry d = Carry::empty(c.batch, c.heads, c.rows, c.value_dim, MemoryKind::kCuda);
    copy_tensor(d.numerator, c.numerator);
    copy_tensor(d.denominator, c.denominator);
    copy_tensor(d.max, c.max);
    return d;
  };
  Carry host_a = random_carry(1), host_b = random_carry(2);
  Carry dev_a = to_device(host_a), dev_b = to_device(host_b);
  merge(host_a, host_b);
  merge(dev_a, dev_b);
  Tensor o_host(DType::kF32, {B, T, H, Dv}), lse_host(DType::kF32, {B, H, T});
  Tensor o_dev(DType::kF32, {B, T, H, Dv}, MemoryKind::kCuda), lse_dev(DType::kF32, {B, H, T}, MemoryKind::kCuda);
  finalize(host_a, TensorView(), o_host, lse_host);
  finalize(dev_a, TensorView(), o_dev, lse_dev);
  RA_CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor o_back = to_memory(o_dev, MemoryKind::kHost), lse_back = to_memory(lse_dev, MemoryKind::kHost);
  for (int64_t i = 0; i < o_host.numel(); ++i) {
    ASSERT_FALSE(std::isnan(o_back.data<float>()[i]));
    ASSERT_NEAR(o_back.data<float>()[i], o_host.data<float>()[i], 1e-5) << i;
  }
  for (int64_t i = 0; i < lse_host.numel(); ++i) {
    const float h = lse_host.data<float>()[i], d = lse_back.data<float>()[i];
    if (std::isinf(h)) ASSERT_EQ(h, d) << i;
    else ASSERT_NEAR(d, h, 1e-5) << i;
  }
}

// The device fold (a block's O and LSE into the carry: the ring's cudnn steps) and finalize in each input dtype, on
// rows that move four features at a time (Dv = 40) and one at a time (Dv = 6), against the host's merge of the same
// block as a carry {max = LSE, sum = 1, numerator = O} and its finalize; some block rows empty (LSE = -inf), folded
// into the carry at a row offset.
TEST(CudaCarry, FoldAndFinalizeInEveryDtypeMatchHost) {
  RA_REQUIRE_GPU();
  const int64_t B = 2, H = 3, T = 17, block_rows = 11, offset = 4;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t dv : {int64_t(40), int64_t(6)}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " Dv=" + std::to_string(dv));
      Carry host = Carry::empty(B, H, T, dv);
      for (int64_t r = 0; r < host.row_count(); ++r) {
        if (r % 5 == 0) continue;  // an empty carry row
        host.max.data<float>()[r] = normal(rng) * 3;
        host.denominator.data<float>()[r] = 1.0f + std::fabs(normal(rng));
        for (int64_t d = 0; d < dv; ++d) host.numerator.data<float>()[r * dv + d] = normal(rng);
      }
      Carry device = Carry::empty(B, H, T, dv, MemoryKind::kCuda);
      copy_tensor(device.numerator, host.numerator), copy_tensor(device.denominator, host.denominator);
      copy_tensor(device.max, host.max);
      const Tensor o = random_normal(dtype, {B, block_rows, H, dv}, rng);
      Tensor lse(DType::kF32, {B, H, block_rows});
      for (int64_t r = 0; r < lse.numel(); ++r) lse.data<float>()[r] = r % 7 == 3 ? -INFINITY : normal(rng) * 3;
      fold_output_lse_cuda(device, to_memory(o.view(), MemoryKind::kCuda), to_memory(lse.view(), MemoryKind::kCuda),
                           offset, nullptr);
      Carry block = Carry::empty(B, H, block_rows, dv);
      const std::vector<float> o32 = as_f32(o.view());
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < block_rows; ++t) {
            const int64_t r = (b * H + h) * block_rows + t;
            block.max.data<float>()[r] = lse.data<float>()[r], block.denominator.data<float>()[r] = 1.0f;
            for (int64_t d = 0; d < dv; ++d) block.numerator.data<float>()[r * dv + d] = o32[size_t(((b * block_rows + t) * H + h) * dv + d)];
          }
      merge(host, block, offset);
      Tensor o_host(dtype, {B, T, H, dv}), lse_host(DType::kF32, {B, H, T});
      Tensor o_dev(dtype, {B, T, H, dv}, MemoryKind::kCuda), lse_dev(DType::kF32, {B, H, T}, MemoryKind::kCuda);
      finalize(host, TensorView(), o_host, lse_host);
      finalize(device, TensorView(), o_dev, lse_dev);
      RA_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> want = as_f32(o_host.view()), got = as_f32(o_dev.view());
      const float rounding = dtype == DType::kBF16 ? 1.0f / 128 : dtype == DType::kF16 ? 1.0f / 1024 : 1e-6f;
      int wrong = 0;
      for (size_t i = 0; i < want.size(); ++i) wrong += !(std::fabs(got[i] - want[i]) <= 1e-5f + rounding * std::fabs(want[i]));
      EXPECT_EQ(wrong, 0);
      const std::vector<float> lse_want = as_f32(lse_host.view()), lse_got = as_f32(lse_dev.view());
      for (size_t i = 0; i < lse_want.size(); ++i) {
        if (std::isinf(lse_want[i])) EXPECT_EQ(lse_got[i], lse_want[i]) << i;
        else EXPECT_NEAR(lse_got[i], lse_want[i], 1e-5) << i;
      }
    }
}

TEST(CudaFlash, UnsupportedHeadDimsNameTheFallback) {
  RA_REQUIRE_GPU();
  // (Past 256 the shared validation refuses first, naming the limit.)
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{100, 100}, {128, 12}, {4, 64}}) {
    Problem p(ProblemSpec{1, 16, 16, 2, 2, d, dv, DType::kBF16, Options{}, 3});
    const InputsCopy dev = copy_inputs(p.inputs(), MemoryKind::kCuda);
    auto flash = AttentionRegistry::builtin().create("flash_attn2", Backend::kCuda);
    try {
      flash->forward(dev.inputs, p.params());
      FAIL() << "head_dim " << d << ", v_head_dim " << dv << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("head_dim) is " + std::to_string(d)), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("multiples of 8 up to 256"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("sdpa"), std::string::npos) << e.message();
    }
  }
}

TEST(CudaFlash, HostInputsAreRefusedByName) {
  RA_REQUIRE_GPU();
  Problem p(ProblemSpec{1, 16, 16, 2, 2, 64, 64, DType::kBF16, Options{}, 3});
  auto flash = AttentionRegistry::builtin().create("flash_attn2", Backend::kCuda);
  try {
    flash->forward(p.inputs(), p.params());
    FAIL() << "host inputs accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("host memory"), std::string::npos) << e.message();
  }
}

#if RA_HAVE_CUDNN
TEST(Cudnn, OptionsItCannotExpressNameFlashAttn2) {
  RA_REQUIRE_GPU();
  Problem p(ProblemSpec{1, 64, 64, 2, 2, 64, 64, DType::kBF16, Options{false, false, false, false, true}, 5});
  const InputsCopy dev = copy_inputs(p.inputs(), MemoryKind::kCuda);
  auto impl = AttentionRegistry::builtin().create("cudnn", Backend::kCuda);
  try {
    impl->forward(dev.inputs, p.params());
    FAIL() << "a bias was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cannot express a bias"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("flash_attn2"), std::string::npos) << e.message();
  }
  // Every option it lacks, named at once.
  Problem many(ProblemSpec{1, 64, 64, 2, 2, 64, 64, DType::kBF16, Options{true, true, true, false, true, true}, 6});
  const InputsCopy many_dev = copy_inputs(many.inputs(), MemoryKind::kCuda);
  try {
    impl->forward(many_dev.inputs, many.params());
    FAIL() << "a bias, a mask, a soft cap and a window were accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cannot express a bias, a mask, a logits soft cap and a sliding window here"), std::string::npos)
        << e.message();
  }
}
#endif

TEST(CudaMemory, OutOfMemoryNamesBytesAskedAndFree) {
  RA_REQUIRE_GPU();
  try {
    Tensor huge(DType::kF32, {int64_t(1) << 40}, MemoryKind::kCuda);  // 4 TiB
    FAIL() << "a 4 TiB device allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("out of device memory"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("4398046511104 bytes"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("an f32 tensor of shape (1099511627776)"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("are free"), std::string::npos) << e.message();
  }
  // The device is still usable afterwards.
  Tensor small(DType::kF32, {1024}, MemoryKind::kCuda);
  RA_CUDA_CHECK(cudaDeviceSynchronize());
}

// A call's temporaries come from ringattn's cache: zeroed on the call's stream every time (also when
// the memory is reused), given back there, held for the next call, and handed to the driver on request.
TEST(CudaMemory, TemporariesAreZeroedReusedAndReleased) {
  RA_REQUIRE_GPU();
  release_device_cache();
  CudaStream stream;
  const int64_t n = int64_t(1) << 22;  // 16 MiB of f32
  auto all_zero = [&](const Tensor& t) {
    std::vector<float> host(size_t(t.numel()), 1.0f);
    RA_CUDA_CHECK(cudaMemcpyAsync(host.data(), t.data<float>(), t.view().nbytes(), cudaMemcpyDeviceToHost, stream.get()));
    stream.synchronize();
    return std::all_of(host.begin(), host.end(), [](float x) { return x == 0.0f; });
  };
  cuda_reset_allocated_peak();
  void* first = nullptr;
  {
    const Tensor t = Tensor::temporary(DType::kF32, {n}, MemoryKind::kCuda, stream.get());
    first = t.data<float>();
    EXPECT_TRUE(all_zero(t));
    RA_CUDA_CHECK(cudaMemsetAsync(t.data<float>(), 0xff, t.view().nbytes(), stream.get()));  // NaNs, if reused unzeroed
  }
  EXPECT_GE(cuda_allocated_peak_bytes(), size_t(n) * 4);  // counted like any device tensor
  stream.synchronize();
  EXPECT_GE(device_cache_bytes(), size_t(n) * 4) << "the freed temporary went back to the driver";
  {
    const Tensor again = Tensor::temporary(DType::kF32, {n}, MemoryKind::kCuda, stream.get());
    EXPECT_EQ(again.data<float>(), first) << "the cached block was not reused";
    EXPECT_TRUE(all_zero(again)) << "a reused temporary was not zeroed";
  }
  release_device_cache();
  EXPECT_EQ(device_cache_bytes(), 0u);
}

TEST(CudaMemory, TemporaryOutOfMemoryNamesBytesAskedAndFree) {
  RA_REQUIRE_GPU();
  CudaStream stream;
  {  // something cached, so that the failure first hands the cache back and tries again
    const Tensor t = Tensor::temporary(DType::kF32, {1 << 20}, MemoryKind::kCuda, stream.get());
  }
  stream.synchronize();
  try {
    const Tensor huge = Tensor::temporary(DType::kF32, {int64_t(1) << 40}, MemoryKind::kCuda, stream.get());
    FAIL() << "a 4 TiB device allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("out of device memory"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("4398046511104 bytes"), std::string::npos) << e.message();
  }
  EXPECT_EQ(device_cache_bytes(), 0u) << "the cache was not handed back before failing";
  const Tensor small = Tensor::temporary(DType::kF32, {1024}, MemoryKind::kCuda, stream.get());
  stream.synchronize();
}

// Pinned tensors are host memory the CUDA runtime knows as page-locked: the host reads and writes
// them, and they round-trip through the device unchanged.
TEST(CudaMemory, PinnedTensorsAreHostMemoryThatRoundTrips) {
  RA_REQUIRE_GPU();
  Tensor pinned(DType::kF32, {3, 1000}, MemoryKind::kPinned);
  fill_f32(pinned.view(), 0.5f);
  pinned.data<float>()[1234] = 7.0f;
  cudaPointerAttributes attributes{};
  RA_CUDA_CHECK(cudaPointerGetAttributes(&attributes, pinned.data<float>()));
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);  // registered with the runtime, unlike malloc'd memory
  const Tensor device = to_memory(pinned.view(), MemoryKind::kCuda);
  const Tensor back = to_memory(device.view(), MemoryKind::kPinned);
  EXPECT_EQ(back.view().memory(), MemoryKind::kPinned);
  EXPECT_EQ(std::memcmp(back.view().data(), pinned.view().data(), pinned.view().nbytes()), 0);
  EXPECT_EQ(back.data<float>()[1234], 7.0f);
}

}  // namespace
}  // namespace ra::test

namespace ra::test {
namespace {

// The host's block checksum (attention/ring/block_seal.h, checked against its word-by-word definition in
// block_seal_test.cc) is the reference: the GPU ring's device sum must equal the host ring's.
// The ring's in-flight check: the device checksum is a function of the bytes (same bytes, same sum;
// any flipped bit or swapped pair of words changes it), whatever the launch shape.
TEST(BlockChecksum, SameBytesSameSumAnyChangeDiffers) {
  RA_REQUIRE_GPU();
  std::vector<uint64_t> words(100003);
  std::mt19937_64 rng(3);
  for (uint64_t& w : words) w = rng();
  const size_t bytes = words.size() * 8;
  Tensor buffer(DType::kU8, {int64_t(bytes)}, MemoryKind::kCuda), sum(DType::kU8, {8}, MemoryKind::kCuda);
  auto checksum = [&](const std::vector<uint64_t>& host) {
    RA_CUDA_CHECK(cudaMemcpy(buffer.view().data(), host.data(), bytes, cudaMemcpyHostToDevice));
    block_checksum_cuda(buffer.view().data(), bytes, sum.data<uint64_t>(), nullptr);
    uint64_t out = 0;
    RA_CUDA_CHECK(cudaMemcpy(&out, sum.view().data(), 8, cudaMemcpyDeviceToHost));
    return out;
  };
  const uint64_t base = checksum(words);
  EXPECT_EQ(base, block_checksum(words.data(), bytes));  // the host ring's: one seal format on both rings
  EXPECT_EQ(checksum(words), base);
  std::vector<uint64_t> flipped = words;
  flipped[77777] ^= uint64_t(1) << 41;
  EXPECT_NE(checksum(flipped), base);
  std::vector<uint64_t> swapped = words;
  std::swap(swapped[10], swapped[20]);
  EXPECT_NE(checksum(swapped), base);
  EXPECT_EQ(checksum(words), base);  // the buffer holds `words` again
  flip_byte_cuda(buffer.view().data(), 12345, nullptr);  // the fault-injection hook changes it too
  block_checksum_cuda(buffer.view().data(), bytes, sum.data<uint64_t>(), nullptr);
  uint64_t after = 0;
  RA_CUDA_CHECK(cudaMemcpy(&after, sum.view().data(), 8, cudaMemcpyDeviceToHost));
  EXPECT_NE(after, base);
}

// The ring's own block travels as pieces (k, v, segment ids) without being packed: the trailer sealed
// over the pieces is the checksum of the packed block, zeros in its gaps included.
TEST(BlockChecksum, PiecesSealAsTheAssembledBlock) {
  RA_REQUIRE_GPU();
  std::mt19937_64 rng(11);
  const size_t block_bytes = 3 * 4096 + 512;
  const std::vector<std::pair<size_t, size_t>> placed = {{0, 4096 + 48}, {4096 + 256, 4096}, {2 * 4096 + 512, 4000}};
  std::vector<uint8_t> assembled(block_bytes, 0);
  std::vector<Tensor> sources;
  std::vector<BlockPiece> pieces;
  for (auto [offset, bytes] : placed) {
    std::vector<uint8_t> host(bytes);
    for (uint8_t& b : host) b = uint8_t(rng());
    std::copy(host.begin(), host.end(), assembled.begin() + ptrdiff_t(offset));
    sources.emplace_back(DType::kU8, Shape{int64_t(bytes)}, MemoryKind::kCuda);
    RA_CUDA_CHECK(cudaMemcpy(sources.back().view().data(), host.data(), bytes, cudaMemcpyHostToDevice));
    pieces.push_back({sources.back().view().data(), offset, bytes});
  }
  Tensor block(DType::kU8, {int64_t(block_bytes)}, MemoryKind::kCuda), trailer(DType::kU8, {16}, MemoryKind::kCuda);
  Tensor sum(DType::kU8, {8}, MemoryKind::kCuda);
  RA_CUDA_CHECK(cudaMemcpy(block.view().data(), assembled.data(), block_bytes, cudaMemcpyHostToDevice));
  RA_CUDA_CHECK(cudaMemset(trailer.view().data(), 0xcd, 16));  // stale bytes
  auto* sealed = static_cast<BlockSeal*>(trailer.view().data());
  seal_pieces_cuda(sealed, pieces, 2, nullptr);
  block_checksum_cuda(block.view().data(), block_bytes, sum.data<uint64_t>(), nullptr);
  BlockSeal got{};
  uint64_t assembled_sum = 0;
  RA_CUDA_CHECK(cudaMemcpy(&got, sealed, sizeof(got), cudaMemcpyDeviceToHost));
  RA_CUDA_CHECK(cudaMemcpy(&assembled_sum, sum.view().data(), 8, cudaMemcpyDeviceToHost));
  const uint64_t expected = block_checksum(assembled.data(), block_bytes);
  EXPECT_EQ(assembled_sum, expected);
  EXPECT_EQ(got.origin_rank, 2u);
  EXPECT_EQ(got.magic, BlockSeal::kMagic);
  EXPECT_EQ(got.checksum, expected);
}

// Blocks past 8 GiB (1M tokens on 2 GPUs): a piece that straddles the word whose weight first needs 33
// bits, and one far beyond it, sum as the definition says (no 8 GiB allocation: a piece's offset in
// its block is what sets its weights). A flipped bit and a swap there still change the sum.
TEST(BlockChecksum, WeightsPastEightGiBFollowTheDefinition) {
  RA_REQUIRE_GPU();
  const size_t bytes = 64 * 1024 + 12;
  std::vector<uint8_t> host(bytes);
  std::mt19937_64 rng(13);
  for (uint8_t& b : host) b = uint8_t(rng());
  Tensor piece(DType::kU8, {int64_t(bytes)}, MemoryKind::kCuda), trailer(DType::kU8, {16}, MemoryKind::kCuda);
  auto sealed_sum = [&](const std::vector<uint8_t>& data, size_t offset) {
    RA_CUDA_CHECK(cudaMemcpy(piece.view().data(), data.data(), bytes, cudaMemcpyHostToDevice));
    auto* sealed = static_cast<BlockSeal*>(trailer.view().data());
    seal_pieces_cuda(sealed, {BlockPiece{piece.view().data(), offset, bytes}}, 0, nullptr);
    BlockSeal got{};
    RA_CUDA_CHECK(cudaMemcpy(&got, sealed, sizeof(got), cudaMemcpyDeviceToHost));
    return got.checksum;
  };
  const size_t boundary = size_t(1) << 33;  // word 2^31: weight 2^32 + 1
  for (size_t offset : {boundary - 32 * 1024, boundary, (size_t(1) << 40) + 4, 3 * boundary - 4}) {
    const uint64_t expected = block_checksum(host.data(), bytes, offset / 4);
    EXPECT_EQ(sealed_sum(host, offset), expected) << "piece at byte " << offset;
    std::vector<uint8_t> flipped = host;
    flipped[bytes - 5] ^= 0x10;
    EXPECT_NE(sealed_sum(flipped, offset), expected) << "flipped bit, piece at byte " << offset;
    std::vector<uint8_t> swapped = host;
    std::swap_ranges(swapped.begin() + 40, swapped.begin() + 44, swapped.begin() + 40000);
    EXPECT_NE(sealed_sum(swapped, offset), expected) << "swapped words, piece at byte " << offset;
  }
}

// The trailer a block starts its trip with: its own checksum, the origin rank and the magic word.
TEST(BlockChecksum, SealWritesTheTrailerOnTheDevice) {
  RA_REQUIRE_GPU();
  const size_t payload = 4096;
  std::vector<uint64_t> words(payload / 8);
  std::mt19937_64 rng(5);
  for (uint64_t& w : words) w = rng();
  Tensor block(DType::kU8, {int64_t(payload + sizeof(BlockSeal))}, MemoryKind::kCuda);
  Tensor sum(DType::kU8, {8}, MemoryKind::kCuda);
  RA_CUDA_CHECK(cudaMemset(block.view().data(), 0xab, block.view().nbytes()));  // stale bytes in the trailer
  RA_CUDA_CHECK(cudaMemcpy(block.view().data(), words.data(), payload, cudaMemcpyHostToDevice));
  seal_block_cuda(block.view().data(), payload, 3, nullptr);
  block_checksum_cuda(block.view().data(), payload, sum.data<uint64_t>(), nullptr);
  BlockSeal trailer{};
  uint64_t expected = 0;
  RA_CUDA_CHECK(cudaMemcpy(&trailer, block.data<char>() + payload, sizeof(trailer), cudaMemcpyDeviceToHost));
  RA_CUDA_CHECK(cudaMemcpy(&expected, sum.view().data(), 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(trailer.checksum, expected);
  EXPECT_EQ(trailer.origin_rank, 3u);
  EXPECT_EQ(trailer.magic, BlockSeal::kMagic);
}


// The mask's tile summary (MaskTiles) against one made here from the mask: every tile's states, every chunk's and
// tile's first and last, for masks of documents of each shape (broadcast, per head, per batch row), rows of odd
// length (not 4-byte aligned), keys as one run and in an order that is none (read pair by pair).
TEST(MaskTiles, SummaryMatchesTheMask) {
  RA_REQUIRE_GPU();
  int seen[4] = {};  // tiles by state
  for (uint64_t seed : {30, 31, 32})
    for (bool permuted : {false, true}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (permuted ? " keys permuted" : " keys a run"));
      Options opt;
      opt.mask = opt.mask_documents = true;
      const ProblemSpec spec{2, 333, 517, 4, 2, 64, 64, DType::kBF16, opt, seed};
      const Problem p(spec);
      const InputsCopy dev = copy_inputs(p.inputs(), MemoryKind::kCuda);
      TokenPositions pos = TokenPositions::dense(spec.q_len, spec.kv_len);
      if (permuted)
        for (int64_t j = 0; j < spec.kv_len; ++j) pos.k[size_t(j)] = j * 7 % spec.kv_len;  // 7 and 517 coprime
      const CudaStream stream;
      DevicePositionBuffer buffer;
      CudaAttentionArgs args = make_cuda_args(dev.inputs, buffer.upload(pos, stream.get()), p.params());
      std::vector<uint8_t> states;
      std::vector<int> firsts, lasts;
      DeviceMaskTiles t;
      {
        const MaskTiles summary(args, stream.get());
        t = args.mask_tiles;
        ASSERT_NE(t.states, nullptr);
        const size_t ranges = size_t(t.maps) * (t.row_chunks + t.key_tiles);
        states.resize(size_t(t.maps) * t.row_chunks * t.key_tiles);
        firsts.resize(ranges), lasts.resize(ranges);
        RA_CUDA_CHECK(cudaMemcpyAsync(states.data(), t.states, states.size(), cudaMemcpyDeviceToHost, stream.get()));
        RA_CUDA_CHECK(cudaMemcpyAsync(firsts.data(), t.firsts, ranges * sizeof(int), cudaMemcpyDeviceToHost, stream.get()));
        RA_CUDA_CHECK(cudaMemcpyAsync(lasts.data(), t.lasts, ranges * sizeof(int), cudaMemcpyDeviceToHost, stream.get()));
        stream.synchronize();
      }
      const int64_t mb = p.mask.view().dim(0), mh = p.mask.view().dim(1), T = spec.q_len, S = spec.kv_len;
      EXPECT_EQ(t.maps, (mb > 1 ? spec.batch : 1) * (mh > 1 ? spec.q_heads : 1));
      EXPECT_EQ(t.row_chunks, (T + 63) / 64);
      EXPECT_EQ(t.key_tiles, (S + 127) / 128);
      const uint8_t* m = p.mask.data<uint8_t>();
      for (int64_t b = 0; b < spec.batch; ++b)
        for (int64_t h = 0; h < spec.q_heads; ++h) {
          const int64_t map = (t.per_batch ? b : 0) * t.heads + (t.heads > 1 ? h : 0);
          const uint8_t* mask = m + ((mb > 1 ? b : 0) * mh + (mh > 1 ? h : 0)) * T * S;
          for (int chunk = 0; chunk < t.row_chunks; ++chunk)
            for (int tile = 0; tile < t.key_tiles; ++tile) {
              bool some = false, all = true;
              for (int64_t r = chunk * 64; r < std::min<int64_t>(T, chunk * 64 + 64); ++r)
                for (int64_t j = tile * 128; j < std::min<int64_t>(S, tile * 128 + 128); ++j) {
                  const bool kept = mask[r * S + pos.k[size_t(j)]] != 0;
                  some = some || kept, all = all && kept;
                }
              const uint8_t expected = some ? kMaskTileSome | (all ? kMaskTileAll : 0) : 0;
              ASSERT_EQ(int(states[size_t((map * t.key_tiles + tile) * t.row_chunks + chunk)]), int(expected))
                  << "b " << b << " h " << h << " chunk " << chunk << " tile " << tile;
            }
          for (int chunk = 0; chunk < t.row_chunks; ++chunk) {
            int first = INT_MAX, last = -1;
            for (int tile = 0; tile < t.key_tiles; ++tile)
              if (states[size_t((map * t.key_tiles + tile) * t.row_chunks + chunk)]) first = std::min(first, tile), last = tile;
            const size_t at = size_t(map * t.row_chunks + chunk);
            if (last >= 0) EXPECT_EQ(firsts[at], first) << "chunk " << chunk;
            else EXPECT_GT(firsts[at], lasts[at]) << "chunk " << chunk;
            EXPECT_EQ(lasts[at], last) << "chunk " << chunk;
          }
          for (int tile = 0; tile < t.key_tiles; ++tile) {
            int first = INT_MAX, last = -1;
            for (int chunk = 0; chunk < t.row_chunks; ++chunk)
              if (states[size_t((map * t.key_tiles + tile) * t.row_chunks + chunk)]) first = std::min(first, chunk), last = chunk;
            const size_t at = size_t(t.maps * t.row_chunks + map * t.key_tiles + tile);
            if (last >= 0) EXPECT_EQ(firsts[at], first) << "tile " << tile;
            else EXPECT_GT(firsts[at], lasts[at]) << "tile " << tile;
            EXPECT_EQ(lasts[at], last) << "tile " << tile;
          }
        }
      for (uint8_t state : states) ++seen[state];
    }
  // Documents of up to 600 keys over 517: tiles hidden whole, kept in part and kept whole all occur.
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[kMaskTileSome], 0);
  EXPECT_GT(seen[kMaskTileSome | kMaskTileAll], 0);
}

// A named mask's summary is made at its first call and kept: a later call with the same name, address and shape gets
// the same one, a call without a name its own, and only the most recently used few are kept.
TEST(MaskTiles, KeepsTheSummariesOfAFewNamedMasks) {
  RA_REQUIRE_GPU();
  Options opt;
  opt.mask = opt.mask_documents = true;
  const ProblemSpec spec{1, 200, 300, 2, 2, 64, 64, DType::kBF16, opt, 50};
  const Problem p(spec);
  const InputsCopy dev = copy_inputs(p.inputs(), MemoryKind::kCuda);
  const CudaStream stream;
  DevicePositionBuffer buffer;
  const DevicePositions pos = buffer.upload(TokenPositions::dense(spec.q_len, spec.kv_len), stream.get());
  auto summary_of = [&](uint64_t name) {
    AttentionInputs in = dev.inputs;
    in.mask_identity = name;
    CudaAttentionArgs args = make_cuda_args(in, pos, p.params());
    const MaskTiles summary(args, stream.get());
    return args.mask_tiles.states;
  };
  const int before = kept_mask_tiles_count();
  const uint8_t* first = summary_of(0x6d61736b00);
  EXPECT_EQ(kept_mask_tiles_count(), std::min(before + 1, 8));
  EXPECT_EQ(summary_of(0x6d61736b00), first);
  summary_of(0);
  EXPECT_EQ(kept_mask_tiles_count(), std::min(before + 1, 8)) << "an unnamed mask's summary was kept";
  for (uint64_t name = 1; name <= 12; ++name) summary_of(0x6d61736b00 + name);
  EXPECT_EQ(kept_mask_tiles_count(), 8);
  EXPECT_EQ(summary_of(0x6d61736b0c), summary_of(0x6d61736b0c));
  stream.synchronize();
  // Handing the device cache back drops the kept summaries (each would pin its chunk of the pool), and a later call
  // of a name makes its summary again.
  release_device_cache();
  EXPECT_EQ(kept_mask_tiles_count(), 0);
  EXPECT_EQ(device_cache_bytes(), 0u);
  summary_of(0x6d61736b0c);
  EXPECT_EQ(kept_mask_tiles_count(), 1);
  stream.synchronize();
}

}  // namespace
}  // namespace ra::test
