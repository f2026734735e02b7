// cudnn_blocks (attention/cuda/cudnn_blocks.h): how the `cudnn` implementation cuts a call into cuDNN calls.
// On random shards (contiguous, zigzag halves, uneven), causal and not, whole and cut into chunks: every
// (query, key) pair a call's mask lets through is visible by position, every visible pair is in exactly one
// call, and no call exceeds its chunk limits. No GPU and no cuDNN: the logic alone.
#include <gtest/gtest.h>

#include <random>

#include "attention/cuda/cudnn_blocks.h"

namespace ra::test {
namespace {

// Whether a call with this mask lets key j (of its key rows) through to query i (of its query rows).
bool mask_lets_through(const CudnnBlock& b, int64_t i, int64_t j) {
  switch (b.mask) {
    case CudnnMask::kNone: return true;
    case CudnnMask::kCausalTopLeft: return j <= i;
    case CudnnMask::kCausalBottomRight: return j <= i + (b.k.length - b.q.length);
  }
  return false;
}

// Positions of a shard: one run, or two zigzag-like runs of a sequence of `total`.
std::vector<int64_t> shard_positions(std::mt19937& rng, int64_t total) {
  std::uniform_int_distribution<int64_t> pick(0, total - 1);
  int64_t a = pick(rng), b = pick(rng);
  if (a > b) std::swap(a, b);
  std::vector<int64_t> out;
  for (int64_t p = a; p <= b; ++p) out.push_back(p);
  if (rng() % 2) {  // a second run further on, as a zigzag shard's
    const int64_t c = std::uniform_int_distribution<int64_t>(b + 1, total + 40)(rng), length = 1 + rng() % 60;
    for (int64_t p = c; p < c + length; ++p) out.push_back(p);
  }
  return out;
}

// A call of the trial's kind: two random shards, causal two trials in three, chunk limits on or off.
struct RandomCall {
  std::vector<int64_t> q_pos, k_pos;
  AttentionParams p;
  int64_t max_q, max_k;
  std::vector<CudnnBlock> blocks() const {
    return cudnn_blocks(consecutive_runs(q_pos.data(), int64_t(q_pos.size())),
                        consecutive_runs(k_pos.data(), int64_t(k_pos.size())), p, max_q, max_k);
  }
};
RandomCall random_call(std::mt19937& rng, int trial) {
  RandomCall c;
  c.q_pos = shard_positions(rng, 90), c.k_pos = shard_positions(rng, 90);
  c.p.causal = trial % 3 != 0;
  c.max_q = trial % 2 ? 0 : 1 + int64_t(rng() % 40);
  c.max_k = trial % 4 < 2 ? 0 : 1 + int64_t(rng() % 40);
  return c;
}

TEST(CudnnBlocks, EveryVisiblePairInExactlyOneCallWithinTheChunkLimits) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const RandomCall call = random_call(rng, trial);
    const std::vector<int64_t>& q_pos = call.q_pos;
    const std::vector<int64_t>& k_pos = call.k_pos;
    const AttentionParams& p = call.p;
    const int64_t max_q = call.max_q, max_k = call.max_k;
    std::vector<int> covered(q_pos.size() * k_pos.size(), 0);
    for (const CudnnBlock& b : call.blocks()) {
      ASSERT_GT(b.q.length, 0);
      ASSERT_GT(b.k.length, 0);
      if (max_q > 0) {
        ASSERT_LE(b.q.length, max_q) << "trial " << trial;
      }
      if (max_k > 0) {
        ASSERT_LE(b.k.length, max_k) << "trial " << trial;
      }
      for (int64_t i = 0; i < b.q.length; ++i)
        for (int64_t j = 0; j < b.k.length; ++j) {
          const int64_t qi = b.q.index + i, kj = b.k.index + j;
          ASSERT_EQ(q_pos[size_t(qi)], b.q.first_position + i);
          ASSERT_EQ(k_pos[size_t(kj)], b.k.first_position + j);
          if (!mask_lets_through(b, i, j)) continue;
          ASSERT_TRUE(!p.causal || k_pos[size_t(kj)] <= q_pos[size_t(qi)])
              << "trial " << trial << ": a call lets a future key through";
          ++covered[size_t(qi) * k_pos.size() + size_t(kj)];
        }
    }
    for (size_t qi = 0; qi < q_pos.size(); ++qi)
      for (size_t kj = 0; kj < k_pos.size(); ++kj) {
        const bool visible = !p.causal || k_pos[kj] <= q_pos[qi];
        ASSERT_EQ(covered[qi * k_pos.size() + kj], visible ? 1 : 0)
            << "trial " << trial << ": query position " << q_pos[qi] << ", key position " << k_pos[kj];
      }
  }
}

TEST(CudnnBlocks, ChunksAreNearEqualAndAsFewAsTheLimitAllows) {
  const std::vector<PositionRun> q{{0, 100, 0}}, k{{0, 10, 0}};
  const std::vector<CudnnBlock> blocks = cudnn_blocks(q, k, AttentionParams{}, 30, 0);
  ASSERT_EQ(blocks.size(), 4u);  // 100 rows of at most 30: 4 chunks of 25
  for (const CudnnBlock& b : blocks) EXPECT_EQ(b.q.length, 25);
  EXPECT_EQ(cudnn_blocks(q, k, AttentionParams{}).size(), 1u);  // no limit: the pair whole
}

// key_row_writes: on the calls of random shards, every key row is written by exactly one span marked first
// (its first call's) or zeroed as uncovered, and every later call's span over it adds.
TEST(CudnnBlocks, EveryKeyRowWrittenOnceByItsFirstCallOrZeroed) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const RandomCall call = random_call(rng, trial);
    const std::vector<CudnnBlock> blocks = call.blocks();
    const int64_t rows = int64_t(call.k_pos.size());
    const KeyRowWrites writes = key_row_writes(blocks, rows);
    ASSERT_EQ(writes.per_block.size(), blocks.size());
    std::vector<int> written(size_t(rows), 0), seen(size_t(rows), 0);
    for (size_t i = 0; i < blocks.size(); ++i) {
      int64_t at = blocks[i].k.index;  // the spans tile the block's key rows in order
      for (const RowSpan& s : writes.per_block[i]) {
        ASSERT_EQ(s.index, at) << "trial " << trial;
        ASSERT_GT(s.length, 0);
        for (int64_t r = s.index; r < s.index + s.length; ++r) {
          ASSERT_EQ(s.first, seen[size_t(r)] == 0) << "trial " << trial << ", row " << r;
          written[size_t(r)] += s.first;
          ++seen[size_t(r)];
        }
        at += s.length;
      }
      ASSERT_EQ(at, blocks[i].k.index + blocks[i].k.length);
    }
    for (const RowSpan& s : writes.uncovered)
      for (int64_t r = s.index; r < s.index + s.length; ++r) ++written[size_t(r)];
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(written[size_t(r)], 1) << "trial " << trial << ", row " << r;
  }
}

}  // namespace
}  // namespace ra::test
