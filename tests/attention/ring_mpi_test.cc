// Ring attention under mpirun (run at 1, 2, 3 and 4 ranks): every rank builds the same global
// problem, keeps its rows by the layout, runs `ring`, and compares its rows with the f64 reference
// and with the single-process flash result. Pass / fail is agreed over all ranks.
// With --backend=cuda (label gpu): one GPU per rank, the ring over NCCL, inputs and outputs staged
// through device memory; the same cases, with v_head_dim = head_dim (unless a case names it) and 16-bit
// inputs for the tensor-core kernel. Exits 77 (skipped) when no GPU is visible.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "attention/registry.h"
#include "attention/ring/ring.h"
#include "collectives/call_agreement.h"
#include "collectives/mpi_communicator.h"
#include "collectives/mpi_session.h"
#include "mesh/mesh_shape.h"
#include "runtime/memory.h"
#include "tests/support/problem.h"
#include "tests/support/mpi_gtest.h"
#include "tests/support/ring_shard.h"
#include "tests/support/ring_test_args.h"

#if RA_HAVE_CUDA
#include <nccl.h>

#include "collectives/nccl_communicator.h"
#include "collectives/peer_copy_ring.h"
#include "runtime/cuda_device.h"
#endif

namespace ra::test {
namespace {

MpiCommunicator* g_world = nullptr;
Communicator* g_ring_comm = nullptr;  // the world over MPI, or over NCCL with --backend=cuda
RingTestArgs g_args;  // --backend=cuda, --transport= and whether ranks share GPUs (ring_test_args.h)

struct RingCase {
  SequenceLayout layout;
  Options options;
  DType dtype;
  int64_t q_len, kv_len, q_heads, kv_heads;
  std::string local_impl;
  int64_t head_dim = 64;  // 128: the production shape (on Hopper GPUs the wgmma kernel)
  int64_t v_head_dim = 0;  // 0: 32 on the host, head_dim on GPUs
};

class RingVsReference : public testing::TestWithParam<RingCase> {};

TEST_P(RingVsReference, EveryRankMatchesReference) {
  const RingCase& c = GetParam();
  if (c.local_impl == "cudnn" && !g_args.cuda) GTEST_SKIP() << "cudnn runs on GPUs only";
#if !RA_HAVE_CUDNN
  if (c.local_impl == "cudnn") GTEST_SKIP() << "built without cudnn";
#endif
  const int n = g_world->size(), r = g_world->rank();
  ProblemSpec spec{2, c.q_len, c.kv_len, c.q_heads, c.kv_heads, c.head_dim, c.v_head_dim ? c.v_head_dim : 32, c.dtype,
                   c.options, 42};
  if (g_args.cuda) {
    if (c.v_head_dim == 0) spec.v_head_dim = c.head_dim;
    if (c.dtype == DType::kF32 && c.local_impl == "flash_attn2") spec.dtype = DType::kBF16;
  }
  const DType dtype = spec.dtype;
  Problem global(spec);
  const AttentionInputs g = global.inputs();

  RingContext ctx{g_ring_comm, c.layout, c.q_len, c.kv_len, c.local_impl, std::chrono::milliseconds(30000)};
  ctx.transport = g_args.transport;
  ctx.host_comm = g_world;
  const Shard shard(global, ctx);
  const TokenPositions& pos = shard.pos;
  const AttentionInputs& in = shard.inputs;
  const Tensor &q = shard.q, &bias = shard.bias, &mask = shard.mask, &qs = shard.qs;
  AttentionOutput out;
  if (g_args.cuda) {
    const InputsCopy device_in = copy_inputs(in, MemoryKind::kCuda);
    auto ring = AttentionRegistry::builtin().create("ring", Backend::kCuda, &ctx);
    AttentionOutput device_out = ring->forward(device_in.inputs, global.params(), pos);
    out = AttentionOutput{to_memory(device_out.o, MemoryKind::kHost), to_memory(device_out.lse, MemoryKind::kHost)};
  } else {
    out = AttentionRegistry::builtin().create("ring", Backend::kCpu, &ctx)->forward(in, global.params(), pos);
  }

  // The reference for this rank's rows against every key.
  TokenPositions ref_pos = TokenPositions::dense(c.q_len, c.kv_len);
  AttentionInputs ref_in = g;
  ref_in.q = q;
  if (bias.defined()) ref_in.bias = bias;
  if (mask.defined()) ref_in.mask = mask;
  if (qs.defined()) ref_in.q_segment_ids = qs;
  ref_pos.q = pos.q;
  ReferenceOutput ref = reference_attention_f64(ref_in, global.params(), ref_pos);
  double scale = c.options.dropout ? 1.0 / (1.0 - global.params().dropout_prob) : 1.0;
  Comparison cmp = compare(out.o, out.lse, ref, output_tolerance(dtype, max_abs_value(g.v) * scale), kLseTolerance);

  // Independence from the ring size: the single-process flash result on the same rows.
  AttentionOutput single = AttentionRegistry::builtin().create(c.local_impl == "cudnn" ? "flash_attn2" : c.local_impl, Backend::kCpu)->forward(ref_in, global.params(), ref_pos);
  double drift = 0;
  for (int64_t i = 0; i < out.o.numel(); ++i)
    drift = std::max(drift, double(std::fabs(load_as_f32(out.o.view().data(), dtype, size_t(i)) -
                                             load_as_f32(single.o.view().data(), dtype, size_t(i)))));
  int64_t counts[2] = {cmp.wrong, cmp.nan};
  g_world->all_reduce(counts, 2, ReduceOp::kSum);
  g_world->all_reduce(&drift, 1, ReduceOp::kMax);
  EXPECT_EQ(counts[1], 0) << "NaN on some rank";
  EXPECT_EQ(counts[0], 0) << "wrong elements summed over " << n << " ranks (rank " << r << ": max |err| "
                          << cmp.max_abs_error << ")";
  // Same inputs, different merge order: f32 rounding only (plus one rounding of a 16-bit output).
  EXPECT_LE(drift, 4e-6 + 2 * dtype_unit_roundoff(dtype) * 8);
}

std::vector<RingCase> ring_cases() {
  std::vector<RingCase> cases;
  const std::vector<Options> opts = ring_option_sets();
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped})
    for (const Options& o : opts) {
      cases.push_back({layout, o, DType::kF32, 96, 96, 4, 2, "flash_attn2"});
    }
  cases.push_back({SequenceLayout::kZigzag, opts[1], DType::kF16, 96, 96, 8, 1, "flash_attn2"});
  cases.push_back({SequenceLayout::kContiguous, opts[6], DType::kF16, 96, 96, 4, 4, "sdpa"});
  cases.push_back({SequenceLayout::kContiguous, opts[1], DType::kF32, 48, 96, 4, 2, "flash_attn2"});  // S != T
  cases.push_back({SequenceLayout::kStriped, opts[2], DType::kBF16, 72 * 2, 72 * 2, 2, 2, "sdpa"});
  // cudnn as the local kernel (GPU runs only): the block shapes the ring hands it.
  cases.push_back({SequenceLayout::kContiguous, opts[0], DType::kBF16, 96, 96, 4, 2, "cudnn"});
  cases.push_back({SequenceLayout::kContiguous, opts[1], DType::kBF16, 96, 96, 4, 2, "cudnn"});
  cases.push_back({SequenceLayout::kZigzag, opts[1], DType::kF16, 96, 96, 8, 1, "cudnn"});
  cases.push_back({SequenceLayout::kZigzag, Options{true, false, false, true}, DType::kBF16, 96, 96, 4, 4, "cudnn"});
  // Lengths as users have them: odd, not a multiple of the ranks (or of 2N for zigzag), S != T, and
  // fewer tokens than ranks (some ranks hold no query and no key), every layout, causal and not, GQA.
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped}) {
    cases.push_back({layout, opts[0], DType::kF32, 97, 97, 4, 2, "flash_attn2"});
    cases.push_back({layout, opts[1], DType::kF32, 97, 97, 4, 2, "flash_attn2"});
    cases.push_back({layout, opts[6], DType::kF32, 97, 97, 4, 2, "flash_attn2"});
    cases.push_back({layout, opts[1], DType::kF32, 53, 97, 4, 1, "flash_attn2"});
    cases.push_back({layout, opts[2], DType::kBF16, 97, 61, 4, 2, "sdpa"});
    cases.push_back({layout, opts[1], DType::kF32, 3, 3, 2, 2, "flash_attn2"});
    cases.push_back({layout, opts[0], DType::kF32, 2, 5, 2, 1, "flash_attn2"});
  }
  cases.push_back({SequenceLayout::kZigzag, opts[1], DType::kBF16, 99, 99, 4, 2, "cudnn"});
  // head_dim 128, the production shape: on Hopper the ring's steps run the wgmma kernel.
  cases.push_back({SequenceLayout::kZigzag, opts[1], DType::kBF16, 256, 256, 4, 2, "flash_attn2", 128});
  cases.push_back({SequenceLayout::kContiguous, opts[0], DType::kBF16, 256, 256, 4, 4, "flash_attn2", 128});
  cases.push_back({SequenceLayout::kStriped, opts[7], DType::kF16, 203, 203, 4, 1, "flash_attn2", 128});
  // Dropout alone in 16-bit (dropout_keys_pair_up): at T = 256 each rank's chunks pair up in 16s on 2 ranks (the wgmma
  // dropout instances: contiguous runs, and zigzag's two runs from the host's positions); striped positions and T =
  // 200's zigzag chunks of 50 do not (the extras).
  Options dropout;
  dropout.dropout = dropout.causal = true;
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped})
    cases.push_back({layout, dropout, DType::kBF16, 256, 256, 4, 2, "flash_attn2", 128});
  cases.push_back({SequenceLayout::kZigzag, dropout, DType::kBF16, 200, 200, 4, 2, "flash_attn2", 128});
  // head_dim 256 on positions only: on Hopper the ring's steps run the wgmma kernel's 64-key tiles.
  cases.push_back({SequenceLayout::kZigzag, opts[1], DType::kBF16, 230, 230, 4, 2, "flash_attn2", 256});
  // Head dims between the flash kernels' instances, Dv != D (MLA's 192 / 128): the carry holds Dv columns.
  cases.push_back({SequenceLayout::kZigzag, opts[6], DType::kBF16, 150, 150, 4, 2, "flash_attn2", 192, 128});
  cases.push_back({SequenceLayout::kStriped, opts[1], DType::kF16, 131, 131, 4, 4, "flash_attn2", 80, 80});
  // A mask of documents (whole tiles hidden and kept): on Hopper the wgmma mask instances summarise each step's
  // mask by tiles, over the striped layout's keys (positions that are no run) and zigzag's halves.
  Options documents = opts[5], causal_documents = opts[5];
  documents.mask_documents = causal_documents.mask_documents = causal_documents.causal = true;
  cases.push_back({SequenceLayout::kStriped, documents, DType::kBF16, 520, 520, 4, 2, "flash_attn2", 128});
  cases.push_back({SequenceLayout::kZigzag, causal_documents, DType::kF16, 520, 520, 4, 2, "flash_attn2", 64});
  cases.push_back({SequenceLayout::kZigzag, opts[1], DType::kBF16, 150, 150, 4, 2, "cudnn", 192, 128});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Mpi, RingVsReference, testing::ValuesIn(ring_cases()), [](const auto& info) {
  const RingCase& c = info.param;
  return std::string(layout_name(c.layout)) + "_" + c.options.name() + "_" + std::string(dtype_name(c.dtype)) + "_T" +
         std::to_string(c.q_len) + "_S" + std::to_string(c.kv_len) + "_" + c.local_impl + "_D" + std::to_string(c.head_dim) +
         (c.v_head_dim ? "_Dv" + std::to_string(c.v_head_dim) : "") + "_H" + std::to_string(c.q_heads) + "x" + std::to_string(c.kv_heads);
});

// --deterministic: rings of 1, 2, ... world-size ranks (the first n ranks of the world) give the same
// bits, for every layout and option set, and match the f64 reference.
struct DeterministicCase {
  SequenceLayout layout;
  Options options;
  DType dtype;
  int64_t q_len, kv_len, q_heads, kv_heads;
};

class DeterministicRing : public testing::TestWithParam<DeterministicCase> {};

TEST_P(DeterministicRing, SameBitsForEveryRingSize) {
  if (g_args.cuda) GTEST_SKIP() << "the deterministic ring runs on the host";
  const DeterministicCase& c = GetParam();
  Problem global(ProblemSpec{2, c.q_len, c.kv_len, c.q_heads, c.kv_heads, 64, 32, c.dtype, c.options, 7});
  const int64_t B = 2, Hq = c.q_heads, T = c.q_len, Dv = 32;
  std::vector<std::vector<double>> results;  // per ring size: O (B, T, Hq, Dv) then LSE (B, Hq, T)
  for (int n = 1; n <= g_world->size(); ++n) {
    std::vector<double> result(size_t(B * T * Hq * Dv + B * Hq * T), 0.0);
    const bool member = g_world->rank() < n;
    auto comm = g_world->split(member ? 0 : 1, g_world->rank());
    if (member) {
      RingContext ctx{comm.get(), c.layout, c.q_len, c.kv_len, "flash_attn2", std::chrono::milliseconds(30000)};
      ctx.deterministic = true;
      const Shard shard(global, ctx);
      AttentionOutput out =
          AttentionRegistry::builtin().create("ring", Backend::kCpu, &ctx)->forward(shard.inputs, global.params(), shard.pos);
      const int64_t rows = int64_t(shard.q_rows.size());
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t h = 0; h < Hq; ++h) {
            const int64_t t = shard.q_rows[size_t(i)];
            for (int64_t d = 0; d < Dv; ++d)
              result[size_t(((b * T + t) * Hq + h) * Dv + d)] =
                  load_as_f32(out.o.view().data(), c.dtype, size_t(((b * rows + i) * Hq + h) * Dv + d));
            result[size_t(B * T * Hq * Dv + (b * Hq + h) * T + t)] = out.lse.data<float>()[(b * Hq + h) * rows + i];
          }
    }
    g_world->all_reduce(result.data(), result.size(), ReduceOp::kSum);  // one rank holds each value: exact
    results.push_back(std::move(result));
  }
  for (size_t n = 1; n < results.size(); ++n) {
    size_t differing = 0;
    for (size_t i = 0; i < results[0].size(); ++i) differing += !(results[n][i] == results[0][i]);
    EXPECT_EQ(differing, 0u) << "ring of " << n + 1 << " ranks differs from one rank in " << differing << " values";
  }
  // And the one-rank result is right.
  const AttentionInputs g = global.inputs();
  ReferenceOutput ref = reference_attention_f64(g, global.params(), TokenPositions::dense(c.q_len, c.kv_len));
  Tensor o(DType::kF32, Shape{B, T, Hq, Dv}), lse(DType::kF32, Shape{B, Hq, T});
  for (int64_t i = 0; i < o.numel(); ++i) o.data<float>()[i] = float(results[0][size_t(i)]);
  for (int64_t i = 0; i < lse.numel(); ++i) lse.data<float>()[i] = float(results[0][size_t(o.numel() + i)]);
  const double scale = c.options.dropout ? 1.0 / (1.0 - global.params().dropout_prob) : 1.0;
  Comparison cmp = compare(o, lse, ref, output_tolerance(c.dtype, max_abs_value(g.v) * scale), kLseTolerance);
  EXPECT_EQ(cmp.nan, 0);
  EXPECT_EQ(cmp.wrong, 0) << "max |err| " << cmp.max_abs_error;
}

std::vector<DeterministicCase> deterministic_cases() {
  Options all{true, true, true, true, true, true, true, true}, causal_sinks;
  causal_sinks.causal = causal_sinks.sinks = causal_sinks.softcap = true;
  std::vector<DeterministicCase> cases;
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped}) {
    cases.push_back({layout, all, DType::kF32, 96, 96, 4, 2});
    cases.push_back({layout, causal_sinks, DType::kBF16, 96, 96, 4, 1});
    cases.push_back({layout, all, DType::kF32, 97, 97, 4, 2});  // uneven shards
  }
  cases.push_back({SequenceLayout::kContiguous, causal_sinks, DType::kF16, 48, 120, 2, 2});  // S != T
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Mpi, DeterministicRing, testing::ValuesIn(deterministic_cases()), [](const auto& info) {
  const DeterministicCase& c = info.param;
  return std::string(layout_name(c.layout)) + "_" + c.options.name() + "_" + std::string(dtype_name(c.dtype)) + "_T" +
         std::to_string(c.q_len) + "_S" + std::to_string(c.kv_len);
});

TEST(RingMpi, ExchangeMovesBlocksAroundTheRing) {
  const int n = g_world->size(), r = g_world->rank();
  std::vector<int> send(1000, r), recv(1000, -1);
  g_world->ring_shift(send.data(), recv.data(), send.size() * sizeof(int), 0)->wait(std::chrono::seconds(30));
  EXPECT_EQ(recv[999], (r + n - 1) % n);
}

// RINGATTN_FAULT is the CLI's (launch/job.cc): a ring made by a library user injects no fault from the
// environment (here: an exit of rank 0 at the first step, which would end the test).
TEST(RingMpi, LibraryRingIgnoresTheFaultVariable) {
  if (g_args.cuda) GTEST_SKIP() << "the host ring's case";
  ASSERT_EQ(setenv("RINGATTN_FAULT", "exit:rank=0:step=0", 1), 0);
  Problem global(ProblemSpec{1, 24, 24, 2, 2, 16, 16, DType::kF32, Options{}, 5});
  RingContext ctx{g_world, SequenceLayout::kZigzag, 24, 24, "flash_attn2", std::chrono::milliseconds(30000)};
  const Shard shard(global, ctx);
  const AttentionOutput out =
      AttentionRegistry::builtin().create("ring", Backend::kCpu, &ctx)->forward(shard.inputs, global.params(), shard.pos);
  unsetenv("RINGATTN_FAULT");
  EXPECT_EQ(out.o.view().dim(1), int64_t(shard.pos.q.size()));
  EXPECT_EQ(ctx.fault.kind, FaultPlan::Kind::kNone);
}

// Settings the host ring cannot honour are refused when it is made, on every rank, naming them: a GPU
// transport (it sends over MPI), and a bf16 gradient wire beside deterministic (its exact sums travel in fixed point).
TEST(RingMpi, HostRingRefusesSettingsItCannotHonour) {
  if (g_args.cuda) GTEST_SKIP() << "the host ring's case";
  auto refusal = [](RingContext ctx) {
    try {
      AttentionRegistry::builtin().create("ring", Backend::kCpu, &ctx);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("made");
  };
  const RingContext plain{g_world, SequenceLayout::kZigzag, 24, 24, "flash_attn2", std::chrono::milliseconds(30000)};
  RingContext transport = plain, wire = plain;
  transport.transport = RingTransport::kNccl;
  wire.deterministic = true;
  wire.gradient_wire = DType::kBF16;
  EXPECT_NE(refusal(transport).find("ring transport nccl moves the GPU ring's blocks"), std::string::npos);
  EXPECT_NE(refusal(wire).find("gradient wire bf16 with deterministic on the host ring"), std::string::npos);
  wire.gradient_wire = DType::kF32;
  EXPECT_EQ(refusal(wire), "made");
}

// A rank whose arguments are refused (here the last rank's k of another head dim, then its dO of another
// value head dim) stops every rank at the call's start, each naming that rank and its reason, long before
// the step timeout; the ring is used again afterwards, as nothing of the refused call is left in flight.
TEST(RingMpi, OneRanksRefusalStopsEveryRankAtOnce) {
  const int n = g_world->size(), r = g_world->rank();
  if (n == 1) GTEST_SKIP() << "one rank has no other to tell";
  const int64_t length = 8 * n;
  Problem global(ProblemSpec{1, length, length, 2, 2, 16, 16, g_args.cuda ? DType::kBF16 : DType::kF32, Options{}, 7});
  RingContext ctx{g_ring_comm, SequenceLayout::kZigzag, length, length, "flash_attn2",
                  std::chrono::milliseconds(20000)};
  ctx.transport = g_args.transport;
  ctx.host_comm = g_world;
  const Shard shard(global, ctx);
  const MemoryKind memory = g_args.cuda ? MemoryKind::kCuda : MemoryKind::kHost;
  const InputsCopy good = copy_inputs(shard.inputs, memory);
  const Tensor narrow_k = to_memory(Tensor(shard.k.dtype(), {1, shard.k.view().dim(1), 2, 8}).view(), memory);
  AttentionInputs in = good.inputs;
  if (r == n - 1) in.k = narrow_k.view();
  auto ring = AttentionRegistry::builtin().create("ring", g_args.cuda ? Backend::kCuda : Backend::kCpu, &ctx);
  // What the call raised on this rank, and after how many seconds.
  auto refusal = [](auto&& call) {
    const auto start = std::chrono::steady_clock::now();
    std::string error = "no error";
    try {
      call();
    } catch (const std::exception& e) {
      error = e.what();
    }
    return std::pair{error, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  };
  const std::string last = "rank " + std::to_string(n - 1) + " of " + std::to_string(n) + " refused its part";
  const auto [forward_error, forward_took] = refusal([&] { ring->forward(in, global.params(), shard.pos); });
  EXPECT_NE(forward_error.find("k dimension 3 (head_dim) is 8, expected 16"), std::string::npos) << forward_error;
  if (r != n - 1) {
    EXPECT_NE(forward_error.find(last), std::string::npos) << forward_error;
  }
  EXPECT_LT(forward_took, 10.0) << "the step timeout is 20 s";

  const AttentionOutput out = ring->forward(good.inputs, global.params(), shard.pos);  // every rank goes on
  EXPECT_EQ(out.o.view().dim(1), int64_t(shard.pos.q.size()));
  const int64_t rows = out.o.view().dim(1);
  const Tensor d_o = to_memory(Tensor(out.o.dtype(), {1, rows, 2, r == n - 1 ? 8 : 16}).view(), memory);
  const auto [backward_error, backward_took] = refusal([&] {
    ring->backward(good.inputs, global.params(), shard.pos, d_o.view(), ForwardViews{out.o.view(), out.lse.view()});
  });
  EXPECT_NE(backward_error.find("do dimension 3 (v_head_dim) is 8"), std::string::npos) << backward_error;
  if (r != n - 1) {
    EXPECT_NE(backward_error.find(last), std::string::npos) << backward_error;
  }
  EXPECT_LT(backward_took, 10.0);
}

// An agreement over MPI that a rank joins late gives up at its timeout on the others, naming it, instead of
// waiting forever as MPI_Allreduce would; the late rank's own call completes the abandoned collective.
TEST(RingMpi, AnAgreementALateRankJoinsGivesUpAtItsTimeout) {
  if (g_args.cuda) GTEST_SKIP() << "the MPI agreement's case";
  const int n = g_world->size(), r = g_world->rank();
  if (n == 1) GTEST_SKIP() << "one rank is never late";
  MpiCommunicator comm(MPI_COMM_WORLD);  // of its own: the timed-out collective stays pending on it
  if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::string error = "no error";
  try {
    agree_every_rank_goes_on(comm, std::chrono::milliseconds(300), nullptr, "a test call");
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (r == n - 1) {
    EXPECT_EQ(error, "no error");
  } else {
    EXPECT_NE(error.find("a test call: the ranks' agreement to start: not every one of the " + std::to_string(n) +
                         " ranks joined within 300 ms"), std::string::npos) << error;
  }
  g_world->barrier();
}

#if RA_HAVE_CUDA
// One ring shift of every rank's id over `comm` through device memory: what arrived, on the host.
int shifted_rank_id(NcclCommunicator& comm, int id) {
  std::vector<int> send(4096, id), recv(4096, -1);
  Tensor a(DType::kI32, {4096}, MemoryKind::kCuda), b(DType::kI32, {4096}, MemoryKind::kCuda);
  copy_tensor(a.view(), TensorView(send.data(), DType::kI32, {4096}));
  comm.ring_shift(a.data<char>(), b.data<char>(), a.view().nbytes(), 0)->wait(std::chrono::seconds(60));
  copy_tensor(TensorView(recv.data(), DType::kI32, {4096}), b.view());
  return *std::max_element(recv.begin(), recv.end()) == recv[0] ? recv[0] : -2;
}

// ncclCommSplit as the mesh uses it: on "dp=2,sp=N/2" each sp group is its own ring, and a sum over
// it adds only its members.
TEST(NcclMesh, SplitGivesEachAxisGroupItsOwnRing) {
  if (!g_args.cuda || g_world->size() % 2 != 0) GTEST_SKIP() << "needs --backend=cuda and an even number of ranks";
  if (g_args.shared_gpus) GTEST_SKIP() << "ranks share GPUs: no NCCL";
  auto& world = dynamic_cast<NcclCommunicator&>(*g_ring_comm);
  const MeshShape mesh = MeshShape::parse("dp=2,sp=" + std::to_string(g_world->size() / 2));
  const MeshShape::AxisGroup group = mesh.axis_group(g_world->rank(), mesh.axis_index("sp"));
  std::unique_ptr<NcclCommunicator> sp = world.split(group.color, group.key, "sp");
  ASSERT_EQ(sp->size(), g_world->size() / 2);
  ASSERT_EQ(sp->rank(), group.key);
  std::vector<int> c = mesh.coords(g_world->rank());
  c[1] = (c[1] + sp->size() - 1) % sp->size();  // the previous rank of this sp group
  EXPECT_EQ(shifted_rank_id(*sp, g_world->rank()), mesh.rank_of(c));
  int64_t sum = g_world->rank();
  sp->all_reduce(&sum, 1, ReduceOp::kSum);
  int64_t expected = 0;
  for (int r = 0; r < g_world->size(); ++r) expected += mesh.axis_group(r, 1).color == group.color ? r : 0;
  EXPECT_EQ(sum, expected);
}

// A communicator the caller made (blocking, by ncclCommInitRank) used through adopt() and left to
// the caller, who destroys it afterwards.
TEST(NcclMesh, AdoptedCommunicatorRingsAndStaysTheCallers) {
  if (!g_args.cuda) GTEST_SKIP() << "needs --backend=cuda";
  if (g_args.shared_gpus) GTEST_SKIP() << "ranks share GPUs: no NCCL";
  ncclUniqueId id{};
  if (g_world->rank() == 0) {
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, g_world->comm());
  ncclComm_t own = nullptr;
  ASSERT_EQ(ncclCommInitRank(&own, g_world->size(), id, g_world->rank()), ncclSuccess);
  {
    std::unique_ptr<NcclCommunicator> adopted = NcclCommunicator::adopt(own);
    EXPECT_EQ(adopted->rank(), g_world->rank());
    EXPECT_EQ(adopted->size(), g_world->size());
    EXPECT_EQ(shifted_rank_id(*adopted, g_world->rank()), (g_world->rank() + g_world->size() - 1) % g_world->size());
  }
  EXPECT_EQ(ncclCommDestroy(own), ncclSuccess);  // still alive: the adopter did not destroy it
}

// The copy-engine shift, n - 1 steps with both slots of the window in turn: at step s every rank
// holds the block that started on rank r - s - 1, exactly as NCCL's shift would give.
TEST(PeerCopyRing, EveryBlockVisitsEveryRankInRingOrder) {
  if (!g_args.cuda) GTEST_SKIP() << "needs --backend=cuda";
  std::string why;
  if (!PeerCopyRing::supported(*g_world, &why)) GTEST_SKIP() << "copy engines unavailable: " << why;
  const int n = g_world->size(), r = g_world->rank();
  constexpr int64_t kInts = 3 << 20;  // 12 MiB blocks: several copy-engine chunks
  const size_t bytes = size_t(kInts) * sizeof(int);
  Tensor window(DType::kU8, {int64_t(2 * bytes)}, MemoryKind::kCuda), own(DType::kI32, {kInts}, MemoryKind::kCuda);
  std::vector<int> host(static_cast<size_t>(kInts));
  for (int64_t i = 0; i < kInts; ++i) host[size_t(i)] = r * 1000003 + int(i % 9973);
  copy_tensor(own.view(), TensorView(host.data(), DType::kI32, {kInts}));
  CudaStream stream;
  {
    PeerCopyRing ring(*g_world, window.data<char>(), 2 * bytes, stream.get());
    const char* send = own.data<char>();
    for (int step = 0; step + 1 < n; ++step) {
      const size_t into = size_t((step + 1) % 2) * bytes;
      ring.shift(send, into, bytes, step, std::chrono::seconds(60))->wait(std::chrono::seconds(60));
      copy_tensor(TensorView(host.data(), DType::kI32, {kInts}),
                  TensorView(window.data<char>() + into, DType::kI32, {kInts}, MemoryKind::kCuda));
      const int origin = ((r - step - 1) % n + n) % n;
      int wrong = 0;
      for (int64_t i = 0; i < kInts; ++i) wrong += host[size_t(i)] != origin * 1000003 + int(i % 9973);
      EXPECT_EQ(wrong, 0) << "step " << step << " on rank " << r << ": expected the block of rank " << origin;
      send = window.data<char>() + into;
    }
  }
  int64_t failures = testing::Test::HasFailure() ? 1 : 0;
  g_world->all_reduce(&failures, 1, ReduceOp::kSum);
  EXPECT_EQ(failures, 0);
}
#endif

}  // namespace
}  // namespace ra::test

int main(int argc, char** argv) {
  ra::MpiSession mpi(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  ra::MpiCommunicator world(MPI_COMM_WORLD);
  ra::test::g_world = &world;
  ra::test::g_ring_comm = &world;
  const ra::test::RingTestArgs& args = ra::test::g_args =
      ra::test::parse_ring_test_args(argc, argv, world, mpi.local_rank(), "ring_mpi_test");
  if (args.skip_code) return args.skip_code;
#if RA_HAVE_CUDA
  std::unique_ptr<ra::NcclCommunicator> nccl;
  if (args.cuda && !args.shared_gpus) {
    nccl = std::make_unique<ra::NcclCommunicator>(world);
    ra::test::g_ring_comm = nccl.get();
  }
#endif
  return ra::test::run_tests_on_every_rank(world.rank());
}
