// Ring attention under mpirun (run at 1, 2, 3 and 4 ranks): every rank builds the same global
// problem, keeps its rows by the layout, runs `ring`, and compares its rows with the f64 reference
// and with the single-process flash result. Pass / fail is agreed over all ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "attention/registry.h"
#include "attention/ring.h"
#include "collectives/mpi_communicator.h"
#include "collectives/mpi_session.h"
#include "tests/support/problem.h"

namespace ra::test {
namespace {

MpiCommunicator* g_world = nullptr;

// Rows `idx` of dimension `dim` of a contiguous tensor, as a new contiguous tensor.
HostTensor take(const HostTensor& t, int dim, const std::vector<int64_t>& idx) {
  if (!t.defined()) return {};
  Shape shape = t.shape();
  if (shape[dim] == 1) {  // broadcast dimension: keep it whole
    HostTensor copy(t.dtype(), shape);
    std::memcpy(copy.view().data(), t.view().data(), t.view().nbytes());
    return copy;
  }
  shape[dim] = int64_t(idx.size());
  HostTensor out(t.dtype(), shape);
  const auto in_strides = contiguous_strides(t.shape());
  int64_t outer = 1, inner = in_strides[dim];
  for (int d = 0; d < dim; ++d) outer *= t.shape()[d];
  const size_t elem = dtype_size(t.dtype());
  const char* src = static_cast<const char*>(t.view().data());
  char* dst = static_cast<char*>(out.view().data());
  for (int64_t o = 0; o < outer; ++o)
    for (size_t i = 0; i < idx.size(); ++i)
      std::memcpy(dst + ((o * int64_t(idx.size()) + int64_t(i)) * inner) * int64_t(elem),
                  src + ((o * t.shape()[dim] + idx[i]) * inner) * int64_t(elem), size_t(inner) * elem);
  return out;
}

struct RingCase {
  SequenceLayout layout;
  Options options;
  DType dtype;
  int64_t q_len, kv_len, q_heads, kv_heads;
  std::string local_impl;
};

class RingVsReference : public testing::TestWithParam<RingCase> {};

TEST_P(RingVsReference, EveryRankMatchesReference) {
  const RingCase& c = GetParam();
  const int n = g_world->size(), r = g_world->rank();
  ProblemSpec spec{2, c.q_len, c.kv_len, c.q_heads, c.kv_heads, 64, 32, c.dtype, c.options, 42};
  Problem global(spec);
  const AttentionInputs g = global.inputs();

  RingContext ctx{g_world, c.layout, c.q_len, c.kv_len, c.local_impl, std::chrono::milliseconds(30000)};
  const TokenPositions pos = ring_positions(ctx);
  std::vector<int64_t> q_rows = layout_indices(c.layout, c.q_len, n, r);
  HostTensor q = take(global.q, 1, q_rows), k = take(global.k, 1, pos.k), v = take(global.v, 1, pos.k);
  HostTensor bias = take(global.bias, 2, q_rows), mask = take(global.mask, 2, q_rows);
  HostTensor qs = take(global.q_seg, 1, q_rows), ks = take(global.kv_seg, 1, pos.k);
  AttentionInputs in = g;
  in.q = q;
  in.k = k;
  in.v = v;
  if (bias.defined()) in.bias = bias;
  if (mask.defined()) in.mask = mask;
  if (qs.defined()) {
    in.q_segment_ids = qs;
    in.kv_segment_ids = ks;
  }
  auto ring = AttentionRegistry::builtin().create("ring", Backend::kCpu, &ctx);
  AttentionOutput out = ring->forward(in, global.params(), pos);

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
  Comparison cmp = compare(out.o, out.lse, ref, output_tolerance(c.dtype, max_abs_value(g.v) * scale), kLseTolerance);

  // Independence from the ring size: the single-process flash result on the same rows.
  AttentionOutput single = AttentionRegistry::builtin().create(c.local_impl, Backend::kCpu)->forward(ref_in, global.params(), ref_pos);
  double drift = 0;
  for (int64_t i = 0; i < out.o.numel(); ++i)
    drift = std::max(drift, double(std::fabs(load_as_f32(out.o.view().data(), c.dtype, size_t(i)) -
                                             load_as_f32(single.o.view().data(), c.dtype, size_t(i)))));
  int64_t counts[2] = {cmp.wrong, cmp.nan};
  g_world->all_reduce(counts, 2, ReduceOp::kSum);
  g_world->all_reduce(&drift, 1, ReduceOp::kMax);
  EXPECT_EQ(counts[1], 0) << "NaN on some rank";
  EXPECT_EQ(counts[0], 0) << "wrong elements summed over " << n << " ranks (rank " << r << ": max |err| "
                          << cmp.max_abs_error << ")";
  // Same inputs, different merge order: f32 rounding only (plus one rounding of a 16-bit output).
  EXPECT_LE(drift, 4e-6 + 2 * dtype_unit_roundoff(c.dtype) * 8);
}

std::vector<RingCase> ring_cases() {
  std::vector<RingCase> cases;
  std::vector<Options> opts(8);
  opts[1].causal = true;
  opts[2].window = true;
  opts[3].segments = true;
  opts[4].bias = true;
  opts[5].mask = true;
  opts[6] = Options{true, true, true, true, true, true, true, true};
  opts[7].causal = opts[7].sinks = opts[7].softcap = true;
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped})
    for (const Options& o : opts) {
      cases.push_back({layout, o, DType::kF32, 96, 96, 4, 2, "flash_attn2"});
    }
  cases.push_back({SequenceLayout::kZigzag, opts[1], DType::kF16, 96, 96, 8, 1, "flash_attn2"});
  cases.push_back({SequenceLayout::kContiguous, opts[6], DType::kF16, 96, 96, 4, 4, "sdpa"});
  cases.push_back({SequenceLayout::kContiguous, opts[1], DType::kF32, 48, 96, 4, 2, "flash_attn2"});  // S != T
  cases.push_back({SequenceLayout::kStriped, opts[2], DType::kBF16, 72 * 2, 72 * 2, 2, 2, "sdpa"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Mpi, RingVsReference, testing::ValuesIn(ring_cases()), [](const auto& info) {
  const RingCase& c = info.param;
  return std::string(layout_name(c.layout)) + "_" + c.options.name() + "_" + std::string(dtype_name(c.dtype)) + "_T" +
         std::to_string(c.q_len) + "_S" + std::to_string(c.kv_len) + "_" + c.local_impl;
});

TEST(RingMpi, ExchangeMovesBlocksAroundTheRing) {
  const int n = g_world->size(), r = g_world->rank();
  std::vector<int> send(1000, r), recv(1000, -1);
  g_world->ring_shift(send.data(), recv.data(), send.size() * sizeof(int), 0)->wait(std::chrono::seconds(30));
  EXPECT_EQ(recv[999], (r + n - 1) % n);
}

}  // namespace
}  // namespace ra::test

int main(int argc, char** argv) {
  ra::MpiSession mpi(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  ra::MpiCommunicator world(MPI_COMM_WORLD);
  ra::test::g_world = &world;
  if (world.rank() != 0) {  // one rank prints; all ranks assert
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int result = RUN_ALL_TESTS();
  int any = result;
  MPI_Allreduce(&result, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
