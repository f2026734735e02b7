// The host ring's backward under mpirun (run at 1, 2, 3 and 4 ranks): for every ring size from 1 to the
// world's (the first n ranks), each rank computes the gradients of its shard with `ring`; the shards are
// put back in global order and compared with the f64 reference gradients of the whole problem, and
// with the one-rank ring's. The error against f64 must not grow with the ring's size (the dK / dV
// accumulators travel in f32). Pass / fail is agreed over all ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "attention/backward.h"
#include "attention/compare.h"
#include "attention/cpu/sdpa_cpu.h"
#include "attention/registry.h"
#include "collectives/mpi_communicator.h"
#include "collectives/mpi_session.h"
#include "runtime/random.h"
#include "tests/support/mpi_gtest.h"
#include "tests/support/ring_shard.h"

namespace ra::test {
namespace {

MpiCommunicator* g_world = nullptr;

struct RingBackwardCase {
  SequenceLayout layout;
  Options options;
  DType dtype;
  int64_t q_len, kv_len, q_heads, kv_heads;
  std::string local_impl = "flash_attn2";
  bool shared_bias = false;  // a bias (1, Hq, 1, S): one row shared by every query, so dbias sums over ranks
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
              const Shape& v, const Shape& bias, int64_t q_heads) {
  Verdict verdict;
  auto check = [&](const char* name, const std::vector<double>& values, const std::vector<double>& want, Shape shape) {
    if (want.empty()) return;
    Tensor t(DType::kF32, shape);
    for (size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = float(values[i]);
    const GradientComparison c = compare_gradient(t.view(), want);
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

TEST_P(RingBackward, EveryRingSizeMatchesTheF64GradientsWithoutDrift) {
  const RingBackwardCase& c = GetParam();
  const int64_t B = 2, D = 64, Dv = 32;
  Problem global(ProblemSpec{B, c.q_len, c.kv_len, c.q_heads, c.kv_heads, D, Dv, c.dtype, c.options, 11});
  if (c.shared_bias) {
    std::mt19937_64 rng(5);
    global.bias = random_normal(DType::kF32, {1, c.q_heads, 1, c.kv_len}, rng, 1.0f);
  }
  std::mt19937_64 rng(99);
  const Tensor d_o = random_normal(c.dtype, {B, c.q_len, c.q_heads, Dv}, rng, 1.0f);
  const Shape q_shape{B, c.q_len, c.q_heads, D}, k_shape{B, c.kv_len, c.kv_heads, D}, v_shape{B, c.kv_len, c.kv_heads, Dv};
  const Shape bias_shape = global.bias.defined() ? global.bias.shape() : Shape{};
  const ReferenceGradients ref = reference_attention_backward_f64(
      global.inputs(), global.params(), TokenPositions::dense(c.q_len, c.kv_len), d_o);

  std::vector<Verdict> verdicts;
  std::vector<GlobalGradients> results;
  for (int n = 1; n <= g_world->size(); ++n) {
    GlobalGradients g{std::vector<double>(ref.dq.size()), std::vector<double>(ref.dk.size()),
                      std::vector<double>(ref.dv.size()), std::vector<double>(ref.dbias.size()),
                      std::vector<double>(ref.dsinks.size())};
    const bool member = g_world->rank() < n;
    auto comm = g_world->split(member ? 0 : 1, g_world->rank());
    if (member) {
      RingContext ctx{comm.get(), c.layout, c.q_len, c.kv_len, c.local_impl, std::chrono::milliseconds(30000)};
      const Shard shard(global, ctx);
      const Tensor shard_d_o = take(d_o, 1, shard.q_rows);
      auto ring = AttentionRegistry::builtin().create("ring", Backend::kCpu, &ctx);
      ASSERT_TRUE(ring->has_backward());
      const Gradients grads = ring->backward(shard.inputs, global.params(), shard.pos, shard_d_o.view(), nullptr, true);
      scatter_rows(grads.dq, shard.q_rows, c.q_len, g.dq);
      scatter_rows(grads.dk, shard.pos.k, c.kv_len, g.dk);
      scatter_rows(grads.dv, shard.pos.k, c.kv_len, g.dv);
      const bool first = comm->rank() == 0;  // values every rank of the ring holds: taken from one
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
    verdicts.push_back(judge(g, ref, q_shape, k_shape, v_shape, bias_shape, c.q_heads));
    results.push_back(std::move(g));
  }
  for (size_t i = 0; i < verdicts.size(); ++i) {
    const Verdict& v = verdicts[i];
    EXPECT_EQ(v.nan, 0) << "ring of " << i + 1 << ": NaN";
    EXPECT_EQ(v.wrong, 0) << "ring of " << i + 1 << ": wrong gradients (" << v.worst << ", max |err| " << v.error << ")";
    // Flat error: f32 accumulators on the wire add only f32 rounding per hop.
    EXPECT_LE(v.error, 1.25 * verdicts[0].error + 1e-5)
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
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Mpi, RingBackward, testing::ValuesIn(ring_backward_cases()), [](const auto& info) {
  const RingBackwardCase& c = info.param;
  return std::string(layout_name(c.layout)) + "_" + c.options.name() + "_" + std::string(dtype_name(c.dtype)) + "_T" +
         std::to_string(c.q_len) + "_S" + std::to_string(c.kv_len) + "_H" + std::to_string(c.q_heads) + "x" +
         std::to_string(c.kv_heads) + "_" + c.local_impl + (c.shared_bias ? "_shared_bias" : "");
});

// The bits of a given ring size and layout do not change from run to run (fixed accumulation order).
TEST(RingBackwardRepeat, SameBitsOnEveryRun) {
  const Options all{true, true, true, true, true, true, true, true};
  Problem global(ProblemSpec{2, 97, 97, 4, 2, 64, 32, DType::kF32, all, 3});
  std::mt19937_64 rng(4);
  const Tensor d_o = random_normal(DType::kF32, {2, 97, 4, 32}, rng, 1.0f);
  RingContext ctx{g_world, SequenceLayout::kZigzag, 97, 97, "flash_attn2", std::chrono::milliseconds(30000)};
  const Shard shard(global, ctx);
  const Tensor shard_d_o = take(d_o, 1, shard.q_rows);
  auto ring = AttentionRegistry::builtin().create("ring", Backend::kCpu, &ctx);
  const Gradients a = ring->backward(shard.inputs, global.params(), shard.pos, shard_d_o.view(), nullptr, true);
  const Gradients b = ring->backward(shard.inputs, global.params(), shard.pos, shard_d_o.view(), nullptr, true);
  int64_t differing = 0;
  for (auto [x, y] : {std::pair{&a.dq, &b.dq}, std::pair{&a.dk, &b.dk}, std::pair{&a.dv, &b.dv}})
    differing += std::memcmp(x->view().data(), y->view().data(), x->view().nbytes()) != 0;
  g_world->all_reduce(&differing, 1, ReduceOp::kSum);
  EXPECT_EQ(differing, 0);
}

// The GPU ring and the exact-sum ring have no backward yet: refused by name, not run wrongly.
TEST(RingBackwardRefusals, DeterministicRingNamesWhatIsMissing) {
  Problem global(ProblemSpec{1, 16, 16, 2, 2, 32, 32, DType::kF32, Options{}, 3});
  RingContext ctx{g_world, SequenceLayout::kContiguous, 16, 16, "flash_attn2", std::chrono::milliseconds(30000)};
  ctx.deterministic = true;
  const Shard shard(global, ctx);
  std::mt19937_64 rng(4);
  const Tensor d_o = take(random_normal(DType::kF32, {1, 16, 2, 32}, rng, 1.0f), 1, shard.q_rows);
  auto ring = AttentionRegistry::builtin().create("ring", Backend::kCpu, &ctx);
  try {
    ring->backward(shard.inputs, global.params(), shard.pos, d_o.view());
    FAIL() << "the deterministic ring ran a backward";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--deterministic"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ra::test

int main(int argc, char** argv) {
  ra::MpiSession mpi(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  ra::MpiCommunicator world(MPI_COMM_WORLD);
  ra::test::g_world = &world;
  return ra::test::run_tests_on_every_rank(world.rank());
}
