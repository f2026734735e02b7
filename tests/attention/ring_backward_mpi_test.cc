// The ring's backward under mpirun (run at 1, 2, 3 and 4 ranks): for every ring size from 1 to the
// world's (the first n ranks), each rank computes the gradients of its shard with `ring`; the shards are
// put back in global order and compared with the f64 reference gradients of the whole problem, and
// with the one-rank ring's. The error against f64 must not grow with the ring's size (the dK / dV
// accumulators travel in f32). Pass / fail is agreed over all ranks.
// With --backend=cuda (label gpu) the GPU ring runs the same check on its own cases (the device kernels'
// dtypes and head dims): over NCCL or copy engines with a GPU per rank (--transport=), or over copy
// engines between ranks that share a GPU when there are more ranks than GPUs.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string_view>
#include <tuple>

#include "attention/backward.h"
#include "attention/compare.h"
#include "attention/cpu/sdpa_cpu.h"
#include "attention/registry.h"
#include "collectives/mpi_communicator.h"
#include "collectives/mpi_session.h"
#include "runtime/memory.h"
#include "runtime/random.h"
#if RA_HAVE_CUDA
#include "collectives/nccl_communicator.h"
#endif
#include "tests/support/mpi_gtest.h"
#include "tests/support/ring_shard.h"
#include "tests/support/ring_test_args.h"

namespace ra::test {
namespace {

MpiCommunicator* g_world = nullptr;
RingTestArgs g_args;  // --backend=cuda, --transport= and whether ranks share GPUs (ring_test_args.h)

struct RingBackwardCase {
  SequenceLayout layout;
  Options options;
  DType dtype;
  int64_t q_len, kv_len, q_heads, kv_heads;
  std::string local_impl = "flash_attn2";
  bool shared_bias = false;  // a bias (1, Hq, 1, S): one row shared by every query, so dbias sums over ranks
  bool cuda = false;         // a GPU ring case (run with --backend=cuda only)
  int64_t head_dim = 64, v_head_dim = 32;
  DType gradient_wire = DType::kF32;  // bf16: --grad-wire bf16 (the error may grow with the ring; bounded, printed)
  bool deterministic = false;         // --deterministic: every ring size gives the same bits
  // 1: on GPUs the own block writes straight into dk / dv, whole from step 0, and the other ranks' blocks
  // run on a second stream beside it (flash_attn2); 2: through the partial, in halves, on one stream.
  int64_t batch = 2;
  bool lse_in_loss = false;  // the loss reads LSE too: a dLSE beside dO (BackwardInputs::d_lse)
};

// The gradients of the whole problem, each value written by the one rank that holds it (zeros elsewhere).
struct GlobalGradients {
  std::vector<double> dq, dk, dv, dbias, dsinks;
  void sum_over(Communicator& comm) {
    for (std::vector<double>* v : {&dq, &dk, &dv, &dbias, &dsinks})
      if (!v->empty()) comm.all_reduce(v->data(), v->size(), ReduceOp::kSum);
  }
};

// Rows `rows` (global indices) of a local (B, rows, H, X) f32 tensor into a global (B, L, H, X) array.
void scatter_rows(const Tensor& local, const std::vector<int64_t>& rows, int64_t global_len, std::vector<double>& out) {
  const int64_t B = local.shape()[0], n = local.shape()[1], width = local.shape()[2] * local.shape()[3];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t x = 0; x < width; ++x)
        out[size_t((b * global_len + rows[size_t(i)]) * width + x)] = local.data<float>()[(b * n + i) * width + x];
}

// The largest |a - b| over every gradient, and what compare_gradient finds wrong against the f64 reference.
struct Verdict {
  double error = 0;  // max |ring - f64| over dq, dk, dv, dbias, dsinks
  int64_t wrong = 0, nan = 0;
  std::string worst;
};

Verdict judge(const GlobalGradients& got, const ReferenceGradients& ref, const Shape& q, const Shape& k,
              const Shape& v, const Shape& bias, int64_t q_heads, DType rounded) {
  Verdict verdict;
  auto check = [&](const char* name, const std::vector<double>& values, const std::vector<double>& want, Shape shape) {
    if (want.empty()) return;
    Tensor t(DType::kF32, shape);
    for (size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = float(values[i]);
    const GradientComparison c = compare_gradient(t.view(), want, rounded);
    verdict.wrong += c.wrong;
    verdict.nan += c.nan;
    if (c.max_abs_error > verdict.error) verdict.error = c.max_abs_error, verdict.worst = name;
    if (c.wrong) verdict.worst += std::string(" ") + name + " wrong (tolerance " + std::to_string(c.tolerance) + ")";
  };
  check("dq", got.dq, ref.dq, q);
  check("dk", got.dk, ref.dk, k);
  check("dv", got.dv, ref.dv, v);
  check("dbias", got.dbias, ref.dbias, bias);
  check("dsinks", got.dsinks, ref.dsinks, Shape{q_heads});
  return verdict;
}

class RingBackward : public testing::TestWithParam<RingBackwardCase> {};

// The ring of the first n ranks of the world on `comm` (an MPI split): on GPUs an NCCL communicator over
// the same ranks where each rank has a GPU of its own.
struct TestRing {
  TestRing(std::unique_ptr<MpiCommunicator> mpi_comm, bool member) : mpi(std::move(mpi_comm)) {
    comm = mpi.get();
#if RA_HAVE_CUDA
    if (g_args.cuda && member && !g_args.shared_gpus && mpi->size() > 1) {
      nccl = std::make_unique<NcclCommunicator>(*mpi);
      comm = nccl.get();
    }
#endif
  }
  std::unique_ptr<MpiCommunicator> mpi;
#if RA_HAVE_CUDA
  std::unique_ptr<NcclCommunicator> nccl;
#endif
  Communicator* comm;
};

// The ring's backward of this rank's shard; with a dLSE, from the ring's forward (O kept in f32, as the
// backward's own forward keeps it) so that dLSE can go with dO.
Gradients ring_backward(const AttentionImpl& ring, const AttentionInputs& in, const AttentionParams& params,
                        const TokenPositions& pos, const TensorView& d_o, const TensorView& d_lse, bool f32_gradients) {
  if (!d_lse.defined()) return ring.backward(in, params, pos, d_o, nullptr, f32_gradients);
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), Dv = in.v.dim(3);
  const Tensor o(DType::kF32, {B, T, Hq, Dv}, in.q.memory()), lse(DType::kF32, {B, Hq, T}, in.q.memory());
  ring.forward_into(in, params, pos, ForwardViews{o.view(), lse.view()});
  return ring.backward(in, params, pos, d_o, ForwardViews{o.view(), lse.view()}, f32_gradients, nullptr, d_lse);
}

// The ring's gradients of this rank's shard, on the host.
Gradients ring_gradients(const RingBackwardCase& c, const Problem& global, RingContext& ctx, const Shard& shard,
                         const Tensor& shard_d_o, const Tensor& shard_d_lse) {
  auto ring = AttentionRegistry::builtin().create("ring", c.cuda ? Backend::kCuda : Backend::kCpu, &ctx);
  EXPECT_TRUE(ring->has_backward());
  if (!c.cuda) return ring_backward(*ring, shard.inputs, global.params(), shard.pos, shard_d_o, shard_d_lse, true);
  const InputsCopy device = copy_inputs(shard.inputs, MemoryKind::kCuda);
  const Tensor d_o = to_memory(shard_d_o.view(), MemoryKind::kCuda);
  const Tensor d_lse = shard_d_lse.defined() ? to_memory(shard_d_lse.view(), MemoryKind::kCuda) : Tensor();
  Gradients g = ring_backward(*ring, device.inputs, global.params(), shard.pos, d_o, d_lse, true);
  for (Tensor* t : {&g.dq, &g.dk, &g.dv, &g.dbias, &g.dsinks})
    if (t->defined()) *t = to_memory(t->view(), MemoryKind::kHost);
  // The gradients in q's dtype (the ring's own path past one rank: dK / dV converted as the last hop's
  // accumulator is added): dK, dV and dsinks are the f32 ones rounded, bit for bit (the same kernels and
  // sums); dQ, whose atomics add in no fixed order, within a rounding of them. (A ring of one is its
  // local kernel's single call, checked in cuda_backward_test.)
  if (ctx.comm->size() == 1) return g;
  Gradients in_dtype = ring_backward(*ring, device.inputs, global.params(), shard.pos, d_o, d_lse, false);
  for (auto [name, f32, got] : {std::tuple{"dk", &g.dk, &in_dtype.dk}, std::tuple{"dv", &g.dv, &in_dtype.dv},
                                std::tuple{"dq", &g.dq, &in_dtype.dq}}) {
    EXPECT_EQ(got->dtype(), c.dtype) << name;
    const size_t n = size_t(f32->numel());
    std::vector<char> bits(n * dtype_size(c.dtype));
    std::vector<float> rounded(n), mine(n);
    convert_from_f32(f32->data<float>(), bits.data(), c.dtype, n);
    convert_to_f32(bits.data(), c.dtype, rounded.data(), n);
    const Tensor host = to_memory(got->view(), MemoryKind::kHost);
    convert_to_f32(host.data<char>(), c.dtype, mine.data(), n);
    double scale = 0, worst = 0;
    for (size_t i = 0; i < n; ++i) {
      scale = std::max(scale, double(std::abs(rounded[i])));
      worst = std::max(worst, double(std::abs(rounded[i] - mine[i])));
    }
    if (std::string_view(name) == "dq") EXPECT_LE(worst, 0.02 * scale + 1e-6) << name << " in " << dtype_name(c.dtype);
    else EXPECT_EQ(worst, 0.0) << name << " in " << dtype_name(c.dtype) << " differs from the f32 gradients rounded";
  }
  if (g.dsinks.defined()) {
    const Tensor dsinks = to_memory(in_dtype.dsinks.view(), MemoryKind::kHost);
    EXPECT_EQ(std::memcmp(dsinks.data<float>(), g.dsinks.data<float>(), size_t(g.dsinks.numel()) * sizeof(float)), 0)
        << "dsinks of the q-dtype path differ from the f32 path's (summed over the ring in both)";
  }
  return g;
}

TEST_P(RingBackward, EveryRingSizeMatchesTheF64GradientsWithoutDrift) {
  const RingBackwardCase& c = GetParam();
  if (c.cuda != g_args.cuda) GTEST_SKIP() << (c.cuda ? "a GPU ring case: run with --backend=cuda" : "a host ring case");
  const int64_t B = c.batch, D = c.head_dim, Dv = c.v_head_dim;
  Problem global(ProblemSpec{B, c.q_len, c.kv_len, c.q_heads, c.kv_heads, D, Dv, c.dtype, c.options, 11});
  if (c.shared_bias) {
    std::mt19937_64 rng(5);
    global.bias = random_normal(DType::kF32, {1, c.q_heads, 1, c.kv_len}, rng, 1.0f);
  }
  std::mt19937_64 rng(99);
  const Tensor d_o = random_normal(c.dtype, {B, c.q_len, c.q_heads, Dv}, rng, 1.0f);
  const Tensor d_lse = c.lse_in_loss ? random_normal(DType::kF32, {B, c.q_heads, c.q_len}, rng, 1.0f) : Tensor();
  const Shape q_shape{B, c.q_len, c.q_heads, D}, k_shape{B, c.kv_len, c.kv_heads, D}, v_shape{B, c.kv_len, c.kv_heads, Dv};
  const Shape bias_shape = global.bias.defined() ? global.bias.shape() : Shape{};
  const ReferenceGradients ref = reference_attention_backward_f64(
      global.inputs(), global.params(), TokenPositions::dense(c.q_len, c.kv_len), d_o, true, d_lse);
  // The device kernels round P and dS to the inputs' dtype for their tensor-core products (sdpa keeps f32).
  // A bf16 wire rounds the dK/dV sums to bf16 at every hop.
  const DType rounded = c.gradient_wire == DType::kBF16           ? DType::kBF16
                        : c.cuda && c.local_impl != "sdpa" ? c.dtype
                                                           : DType::kF32;

  std::vector<Verdict> verdicts;
  std::vector<GlobalGradients> results;
  for (int n = 1; n <= g_world->size(); ++n) {
    GlobalGradients g{std::vector<double>(ref.dq.size()), std::vector<double>(ref.dk.size()),
                      std::vector<double>(ref.dv.size()), std::vector<double>(ref.dbias.size()),
                      std::vector<double>(ref.dsinks.size())};
    const bool member = g_world->rank() < n;
    TestRing test_ring(g_world->split(member ? 0 : 1, g_world->rank()), member);
    if (member) {
      RingContext ctx{test_ring.comm, c.layout, c.q_len, c.kv_len, c.local_impl, std::chrono::milliseconds(30000)};
      ctx.transport = g_args.transport;
      ctx.gradient_wire = c.gradient_wire;
      ctx.deterministic = c.deterministic;
      ctx.host_comm = test_ring.mpi.get();
      const Shard shard(global, ctx);
      const Tensor shard_d_o = take(d_o, 1, shard.q_rows);
      const Tensor shard_d_lse = d_lse.defined() ? take(d_lse, 2, shard.q_rows) : Tensor();
      Gradients grads;
      try {  // a throw on one rank must not skip the collectives below on it (the others would hang)
        grads = ring_gradients(c, global, ctx, shard, shard_d_o, shard_d_lse);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "ring of " << n << ", rank " << test_ring.comm->rank() << ": " << e.what();
        GradAccumulators zeros = GradAccumulators::zeros(shard.inputs, MemoryKind::kHost);
        grads = Gradients{std::move(zeros.dq), std::move(zeros.dk), std::move(zeros.dv), std::move(zeros.dbias), Tensor()};
      }
      scatter_rows(grads.dq, shard.q_rows, c.q_len, g.dq);
      scatter_rows(grads.dk, shard.pos.k, c.kv_len, g.dk);
      scatter_rows(grads.dv, shard.pos.k, c.kv_len, g.dv);
      const bool first = test_ring.comm->rank() == 0;  // values every rank of the ring holds: taken from one
      if (grads.dsinks.defined() && first)
        std::copy_n(grads.dsinks.data<float>(), grads.dsinks.numel(), g.dsinks.begin());
      if (grads.dbias.defined()) {
        if (c.shared_bias) {
          if (first) std::copy_n(grads.dbias.data<float>(), grads.dbias.numel(), g.dbias.begin());
        } else {  // (1, Hq, rows, S): this rank's query rows
          const int64_t rows = int64_t(shard.q_rows.size());
          for (int64_t h = 0; h < c.q_heads; ++h)
            for (int64_t i = 0; i < rows; ++i)
              std::copy_n(grads.dbias.data<float>() + (h * rows + i) * c.kv_len, c.kv_len,
                          g.dbias.begin() + (h * c.q_len + shard.q_rows[size_t(i)]) * c.kv_len);
        }
      }
    }
    g.sum_over(*g_world);  // one rank holds each value: exact
    verdicts.push_back(judge(g, ref, q_shape, k_shape, v_shape, bias_shape, c.q_heads, rounded));
    results.push_back(std::move(g));
  }
  if (c.gradient_wire != DType::kF32 && g_world->rank() == 0) {
    std::printf("bf16 gradient wire, max |err| against f64 by ring size:");
    for (const Verdict& v : verdicts) std::printf(" %.3g", v.error);
    std::printf("\n");
  }
  if (c.deterministic)  // the exact sums: the same bits as one rank, every gradient
    for (size_t n = 1; n < results.size(); ++n) {
      const GlobalGradients &one = results[0], &ring = results[n];
      for (auto [name, a, b] : {std::tuple{"dq", &one.dq, &ring.dq}, std::tuple{"dk", &one.dk, &ring.dk},
                                std::tuple{"dv", &one.dv, &ring.dv}, std::tuple{"dbias", &one.dbias, &ring.dbias},
                                std::tuple{"dsinks", &one.dsinks, &ring.dsinks}}) {
        size_t differing = 0;
        for (size_t i = 0; i < a->size(); ++i) differing += !((*a)[i] == (*b)[i]);
        EXPECT_EQ(differing, 0u) << "ring of " << n + 1 << " ranks: " << name << " differs from one rank's in "
                                 << differing << " values";
      }
    }
  for (size_t i = 0; i < verdicts.size(); ++i) {
    const Verdict& v = verdicts[i];
    EXPECT_EQ(v.nan, 0) << "ring of " << i + 1 << ": NaN";
    EXPECT_EQ(v.wrong, 0) << "ring of " << i + 1 << ": wrong gradients (" << v.worst << ", max |err| " << v.error << ")";
    // Flat error: f32 accumulators on the wire add only f32 rounding per hop. The GPU kernels' forward
    // rounds P (relative to each block's running max) to half precision, so its O and LSE, and with them
    // every dS, move a little with the block split: a wider margin there, far below what accumulators
    // summed in bf16 between hops would add.
    const double margin = c.cuda && c.dtype != DType::kF32 ? 1.5 : 1.25;
    if (c.gradient_wire != DType::kF32) continue;  // bf16 sums: bounded by the tolerance above, not flat
    EXPECT_LE(v.error, margin * verdicts[0].error + 1e-5)
        << "ring of " << i + 1 << " ranks: max |err| " << v.error << " against the f64 gradients, one rank " << verdicts[0].error;
  }
}

std::vector<RingBackwardCase> ring_backward_cases() {
  const std::vector<Options> opts = ring_option_sets();
  std::vector<RingBackwardCase> cases;
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped}) {
    for (const Options& o : opts) cases.push_back({layout, o, DType::kF32, 96, 96, 4, 2});
    cases.push_back({layout, opts[6], DType::kF32, 97, 97, 4, 2});                 // uneven shards
    cases.push_back({layout, opts[1], DType::kBF16, 53, 97, 8, 1});                // S != T, GQA 8:1
    cases.push_back({layout, opts[1], DType::kF32, 3, 3, 2, 2});                   // fewer tokens than ranks
  }
  cases.push_back({SequenceLayout::kZigzag, opts[7], DType::kF16, 96, 96, 4, 2});
  cases.push_back({SequenceLayout::kZigzag, opts[6], DType::kF32, 64, 64, 4, 2, "sdpa"});
  cases.push_back({SequenceLayout::kContiguous, opts[1], DType::kBF16, 72, 72, 4, 4, "blockwise"});
  cases.push_back({SequenceLayout::kZigzag, opts[1], DType::kF32, 96, 96, 4, 2, "flash_attn2", true});
  cases.push_back({SequenceLayout::kContiguous, opts[0], DType::kF32, 96, 96, 4, 2, "flash_attn2", true});
  RingBackwardCase wire{SequenceLayout::kZigzag, opts[6], DType::kF32, 97, 97, 4, 2};  // --grad-wire bf16
  wire.gradient_wire = DType::kBF16;
  cases.push_back(wire);
  wire.options = opts[0], wire.layout = SequenceLayout::kContiguous;
  cases.push_back(wire);
  // --deterministic: the exact sums, every layout, each option and all of them, uneven shards, S != T with
  // GQA 8:1, a bias shared by every rank's rows, fewer tokens than ranks.
  auto exact = [](SequenceLayout layout, const Options& o, DType dtype, int64_t t, int64_t s, int64_t hq, int64_t hkv,
                  bool shared_bias = false) {
    RingBackwardCase c{layout, o, dtype, t, s, hq, hkv, "flash_attn2", shared_bias};
    c.deterministic = true;
    return c;
  };
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped}) {
    cases.push_back(exact(layout, opts[6], DType::kF32, 97, 97, 4, 2));
    cases.push_back(exact(layout, opts[7], DType::kBF16, 53, 97, 8, 1));
  }
  for (int i : {0, 1, 2, 3, 4, 5}) cases.push_back(exact(SequenceLayout::kZigzag, opts[size_t(i)], DType::kF32, 64, 64, 4, 2));
  cases.push_back(exact(SequenceLayout::kContiguous, opts[0], DType::kF16, 48, 120, 2, 2, true));
  cases.push_back(exact(SequenceLayout::kStriped, opts[1], DType::kF32, 3, 3, 2, 2));
  cases.push_back(exact(SequenceLayout::kZigzag, opts[9], DType::kF32, 97, 97, 4, 2));  // skipped blocks
  // A loss that reads LSE too (dLSE folded into delta): every layout with every option, uneven shards; S != T
  // with GQA in bf16; the exact sums; each local kernel.
  auto lse_in_loss = [](RingBackwardCase c) {
    c.lse_in_loss = true;
    return c;
  };
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped}) {
    cases.push_back(lse_in_loss({layout, opts[6], DType::kF32, 97, 97, 4, 2}));
    cases.push_back(lse_in_loss({layout, opts[7], DType::kBF16, 53, 97, 8, 1}));
  }
  cases.push_back(lse_in_loss(exact(SequenceLayout::kZigzag, opts[6], DType::kF32, 97, 97, 4, 2)));
  cases.push_back(lse_in_loss({SequenceLayout::kZigzag, opts[7], DType::kF32, 64, 64, 4, 2, "sdpa"}));
  cases.push_back(lse_in_loss({SequenceLayout::kContiguous, opts[4], DType::kBF16, 72, 72, 4, 4, "blockwise"}));
  // The GPU ring: its kernels' dtypes (flash_attn2 and cudnn: f16 / bf16; sdpa: f32).
  auto gpu = [](SequenceLayout layout, const Options& o, DType dtype, int64_t t, int64_t s, int64_t hq, int64_t hkv,
                const char* impl, bool shared_bias = false) {
    return RingBackwardCase{layout, o, dtype, t, s, hq, hkv, impl, shared_bias, true, 64, 64};
  };
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped}) {
    for (size_t i = 0; i < opts.size(); ++i) {
      cases.push_back(gpu(layout, opts[i], DType::kBF16, 96, 96, 4, 2, "flash_attn2"));
      cases.back().batch = i % 2 == 0 ? 1 : 2;  // both ways of running the steps, over the options
    }
    cases.push_back(gpu(layout, opts[6], DType::kF16, 97, 97, 4, 2, "flash_attn2"));  // uneven shards
    cases.push_back(gpu(layout, opts[1], DType::kBF16, 53, 97, 8, 1, "flash_attn2"));  // S != T, GQA 8:1
    cases.push_back(gpu(layout, opts[6], DType::kF32, 64, 64, 4, 2, "sdpa"));
  }
  const RingBackwardCase cudnn_zigzag = gpu(SequenceLayout::kZigzag, opts[1], DType::kBF16, 256, 256, 4, 2, "cudnn");
  const RingBackwardCase cudnn_contiguous = gpu(SequenceLayout::kContiguous, opts[0], DType::kBF16, 200, 200, 4, 4, "cudnn");
  cases.push_back(cudnn_zigzag);
  cases.push_back(cudnn_contiguous);
  cases.push_back(gpu(SequenceLayout::kZigzag, opts[1], DType::kBF16, 96, 96, 4, 2, "flash_attn2", true));
  cases.push_back(gpu(SequenceLayout::kContiguous, opts[0], DType::kF16, 3, 3, 2, 2, "flash_attn2"));  // fewer tokens than ranks
  // Dropout alone in 16-bit (dropout_keys_pair_up): the wgmma dropout instances where each rank's chunks pair up in
  // 16s (T = 256 on 2 ranks: contiguous, zigzag), the extras where they do not (striped; zigzag chunks of 50).
  Options dropout;
  dropout.dropout = dropout.causal = true;
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped})
    cases.push_back(gpu(layout, dropout, DType::kBF16, 256, 256, 4, 2, "flash_attn2"));
  cases.push_back(gpu(SequenceLayout::kZigzag, dropout, DType::kBF16, 200, 200, 4, 2, "flash_attn2"));
  Options capped_documents;  // Gemma 2's packed documents: the flash kernels' soft-cap instances with segment ids
  capped_documents.causal = capped_documents.segments = capped_documents.softcap = true;
  for (SequenceLayout layout : {SequenceLayout::kZigzag, SequenceLayout::kContiguous})
    cases.push_back(gpu(layout, capped_documents, DType::kBF16, 230, 230, 4, 2, "flash_attn2"));
  RingBackwardCase wide = gpu(SequenceLayout::kZigzag, opts[6], DType::kBF16, 150, 150, 4, 2, "flash_attn2");
  wide.head_dim = wide.v_head_dim = 256;  // the mma.sync kernel's split of 16 keys over two warps, every option
  cases.push_back(wide);
  // Exact 192 / 256 on positions (Hopper): dQ by the query-block kernel, the ring's steps on two streams (B = 1)
  // adding into one dQ accumulator, zigzag causal and contiguous with a window.
  RingBackwardCase apart = gpu(SequenceLayout::kZigzag, opts[1], DType::kBF16, 300, 300, 4, 2, "flash_attn2");
  apart.head_dim = apart.v_head_dim = 256, apart.batch = 1;
  cases.push_back(apart);
  apart.layout = SequenceLayout::kContiguous, apart.options = opts[2], apart.dtype = DType::kF16;
  apart.head_dim = apart.v_head_dim = 192;
  cases.push_back(apart);
  RingBackwardCase mla = gpu(SequenceLayout::kZigzag, opts[6], DType::kBF16, 120, 120, 4, 2, "flash_attn2");
  mla.head_dim = 192, mla.v_head_dim = 128;  // between the instances, Dv != D (the ring carries Dv columns)
  cases.push_back(mla);
  RingBackwardCase cudnn_mla = gpu(SequenceLayout::kZigzag, opts[1], DType::kBF16, 160, 160, 4, 2, "cudnn");
  cudnn_mla.head_dim = 192, cudnn_mla.v_head_dim = 128;  // cuDNN's Dv != D on the ring's half blocks
  cases.push_back(cudnn_mla);
  // cudnn with B = 1: the steps on the second stream beside the own block (per-stream buffers, dQ by atomics).
  for (RingBackwardCase c : {cudnn_zigzag, cudnn_contiguous, cudnn_mla}) {
    c.batch = 1;
    cases.push_back(c);
  }
  // cudnn's steps write their dK / dV partials over, unzeroed (GradViews::kv_unset): uneven shards (a window's
  // rows past the block's), S != T with GQA, the bf16 wire (step 1 through the partial), B = 1 and 2.
  for (int64_t batch : {1, 2}) {
    RingBackwardCase c = gpu(SequenceLayout::kZigzag, opts[1], DType::kBF16, 203, 203, 4, 2, "cudnn");
    c.batch = batch;
    cases.push_back(c);
    c = gpu(SequenceLayout::kContiguous, opts[1], DType::kF16, 101, 203, 8, 2, "cudnn");
    c.batch = batch;
    cases.push_back(c);
    c = gpu(SequenceLayout::kZigzag, opts[1], DType::kBF16, 150, 150, 4, 2, "cudnn");
    c.gradient_wire = DType::kBF16, c.batch = batch;
    cases.push_back(c);
  }
  // A mask of documents (whole tiles hidden and kept): the wgmma mask instances' steps by the mask's tile summary.
  Options documents = opts[5], causal_documents = opts[5];
  documents.mask_documents = causal_documents.mask_documents = causal_documents.causal = true;
  RingBackwardCase masked = gpu(SequenceLayout::kStriped, documents, DType::kBF16, 520, 520, 4, 2, "flash_attn2");
  masked.head_dim = masked.v_head_dim = 128;
  cases.push_back(masked);
  cases.push_back(gpu(SequenceLayout::kZigzag, causal_documents, DType::kF16, 520, 520, 4, 2, "flash_attn2"));
  RingBackwardCase narrow_dims = gpu(SequenceLayout::kStriped, opts[1], DType::kF16, 111, 111, 4, 4, "flash_attn2");
  narrow_dims.head_dim = narrow_dims.v_head_dim = 80;
  cases.push_back(narrow_dims);
  RingBackwardCase gpu_wire = gpu(SequenceLayout::kZigzag, opts[1], DType::kBF16, 96, 96, 4, 2, "flash_attn2");
  gpu_wire.gradient_wire = DType::kBF16;
  cases.push_back(gpu_wire);
  gpu_wire.batch = 1;  // step 1 through the partial on the second stream
  cases.push_back(gpu_wire);
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped})
    cases.push_back(lse_in_loss(gpu(layout, opts[6], DType::kBF16, 97, 97, 4, 2, "flash_attn2")));
  cases.push_back(lse_in_loss(gpu(SequenceLayout::kZigzag, opts[7], DType::kF32, 64, 64, 4, 2, "sdpa")));
  RingBackwardCase lse_b1 = lse_in_loss(gpu(SequenceLayout::kZigzag, opts[1], DType::kF16, 120, 120, 8, 2, "flash_attn2"));
  lse_b1.batch = 1;  // the steps on two streams
  cases.push_back(lse_b1);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Mpi, RingBackward, testing::ValuesIn(ring_backward_cases()), [](const auto& info) {
  const RingBackwardCase& c = info.param;
  return std::string(layout_name(c.layout)) + "_" + c.options.name() + "_" + std::string(dtype_name(c.dtype)) + "_T" +
         std::to_string(c.q_len) + "_S" + std::to_string(c.kv_len) + "_H" + std::to_string(c.q_heads) + "x" +
         std::to_string(c.kv_heads) + "_" + c.local_impl + (c.shared_bias ? "_shared_bias" : "") +
         (c.gradient_wire != DType::kF32 ? "_bf16_wire" : "") + (c.deterministic ? "_deterministic" : "") +
         (c.batch == 1 ? "_B1" : "") + (c.lse_in_loss ? "_lse_in_loss" : "") +
         (c.cuda ? "_cuda" : "");
});

// The bits of a given ring size and layout do not change from run to run (fixed accumulation order; the
// GPU ring with --deterministic, whose local backward then sums dQ in a fixed order), every option.
TEST(RingBackwardRepeat, SameBitsOnEveryRun) {
  const Options all{true, true, true, true, true, true, true, true};
  const bool cuda = g_args.cuda;  // the GPU ring: bf16, head_dim 64, one batch (dBias has one writer per element)
  const int64_t B = cuda ? 1 : 2, T = cuda ? 701 : 97, Dv = cuda ? 64 : 32;
  const DType dtype = cuda ? DType::kBF16 : DType::kF32;
  Problem global(ProblemSpec{B, T, T, 4, 2, 64, Dv, dtype, all, 3});
  std::mt19937_64 rng(4);
  const Tensor d_o = random_normal(dtype, {B, T, 4, Dv}, rng, 1.0f);
  TestRing test_ring(g_world->split(0, g_world->rank()), true);
  RingContext ctx{test_ring.comm, SequenceLayout::kZigzag, T, T, "flash_attn2", std::chrono::milliseconds(30000)};
  ctx.transport = g_args.transport;
  ctx.host_comm = test_ring.mpi.get();
  ctx.deterministic = cuda;  // on the host the ring is without it (its --deterministic is the exact sums)
  const Shard shard(global, ctx);
  const Tensor shard_d_o = take(d_o, 1, shard.q_rows);
  RingBackwardCase c{SequenceLayout::kZigzag, all, dtype, T, T, 4, 2};
  c.cuda = cuda;
  const Gradients a = ring_gradients(c, global, ctx, shard, shard_d_o, Tensor());
  const Gradients b = ring_gradients(c, global, ctx, shard, shard_d_o, Tensor());
  int64_t differing = 0;
  for (auto [x, y] : {std::pair{&a.dq, &b.dq}, std::pair{&a.dk, &b.dk}, std::pair{&a.dv, &b.dv},
                      std::pair{&a.dbias, &b.dbias}})
    differing += std::memcmp(x->view().data(), y->view().data(), x->view().nbytes()) != 0;
  g_world->all_reduce(&differing, 1, ReduceOp::kSum);
  EXPECT_EQ(differing, 0);
}

}  // namespace
}  // namespace ra::test

int main(int argc, char** argv) {
  ra::MpiSession mpi(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  ra::MpiCommunicator world(MPI_COMM_WORLD);
  ra::test::g_world = &world;
  const ra::test::RingTestArgs& args = ra::test::g_args =
      ra::test::parse_ring_test_args(argc, argv, world, mpi.local_rank(), "ring_backward_mpi_test");
  if (args.skip_code) return args.skip_code;
  return ra::test::run_tests_on_every_rank(world.rank());
}
