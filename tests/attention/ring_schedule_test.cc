// The ring's schedule (attention/ring/ring_schedule.h): source ranks, keys and block kinds against a
// reference that looks at every (query, key) pair.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "attention/inputs.h"
#include "attention/ring/ring_schedule.h"

namespace ra {
namespace {

constexpr SequenceLayout kLayouts[] = {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped};

// Every pair: skipped when none is visible, full when all are.
BlockKind kind_of_pairs(const std::vector<int64_t>& queries, const std::vector<int64_t>& keys, const AttentionParams& p) {
  bool any = false, all = true;
  for (int64_t q : queries)
    for (int64_t k : keys) {
      const bool visible = (!p.causal || k <= q) && (p.window_left < 0 || k >= q - p.window_left) &&
                           (p.window_right < 0 || k <= q + p.window_right);
      any = any || visible;
      all = all && visible;
    }
  if (!any) return BlockKind::kSkip;
  return all ? BlockKind::kFull : BlockKind::kPartial;
}

TEST(RingSchedule, SourceRankWalksBackwards) {
  EXPECT_EQ(ring_source_rank(0, 0, 4), 0);
  EXPECT_EQ(ring_source_rank(0, 1, 4), 3);
  EXPECT_EQ(ring_source_rank(2, 3, 4), 3);
  for (int r = 0; r < 5; ++r) {  // every rank sees every block exactly once
    std::vector<int> seen;
    for (int s = 0; s < 5; ++s) seen.push_back(ring_source_rank(r, s, 5));
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
  }
}

TEST(RingSchedule, ClassifiesCausalAndWindowBlocks) {
  EXPECT_EQ(classify_block(0, 63, 64, 127, true, -1, -1), BlockKind::kSkip);     // future
  EXPECT_EQ(classify_block(64, 127, 0, 63, true, -1, -1), BlockKind::kFull);     // past
  EXPECT_EQ(classify_block(0, 63, 0, 63, true, -1, -1), BlockKind::kPartial);    // diagonal
  EXPECT_EQ(classify_block(0, 63, 64, 127, false, -1, -1), BlockKind::kFull);
  EXPECT_EQ(classify_block(200, 263, 0, 63, false, 100, -1), BlockKind::kSkip);  // left of the window
  EXPECT_EQ(classify_block(100, 110, 90, 95, true, 50, 0), BlockKind::kFull);
  EXPECT_EQ(classify_block(100, 110, 40, 95, true, 50, 0), BlockKind::kPartial);
}

TEST(RingSchedule, HoldsEachRanksKeysAndTheLayoutsQueries) {
  for (SequenceLayout layout : kLayouts) {
    const RingSchedule s(layout, 37, 50, 3, 1);
    EXPECT_EQ(s.query_positions(), layout_query_positions(layout, 37, 50, 3, 1));
    std::vector<int64_t> all;
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(s.keys(r), layout_indices(layout, 50, 3, r));
      EXPECT_EQ(s.key_offset(r), int64_t(all.size()));
      EXPECT_EQ(s.rows(r), layout_rows(layout, 50, 3, r));
      all.insert(all.end(), s.keys(r).begin(), s.keys(r).end());
    }
    EXPECT_EQ(s.all_keys(), all);
    EXPECT_EQ(s.slot_rows(), layout_max_rows(layout, 50, 3));
    EXPECT_TRUE(s.keys_sorted());
    for (int step = 0; step < 3; ++step) EXPECT_EQ(s.source(step), ring_source_rank(1, step, 3));
  }
}

// The GPU kernels compute a row's position where the positions are one run (run_start): a single call's and
// every block of the contiguous layout, and zigzag's last rank (its two chunks meet in the middle); the other
// zigzag blocks and striped ones are not runs.
TEST(RunStart, FindsOneRunOfPositions) {
  EXPECT_EQ(run_start(std::vector<int64_t>{}), std::nullopt);
  EXPECT_EQ(run_start(std::vector<int64_t>{7}), 7);
  EXPECT_EQ(run_start(std::vector<int64_t>{5, 6, 7, 8}), 5);
  EXPECT_EQ(run_start(std::vector<int64_t>{5, 6, 8}), std::nullopt);
  EXPECT_EQ(run_start(std::vector<int64_t>{3, 2}), std::nullopt);
  EXPECT_EQ(run_start(TokenPositions::dense(5, 9).q), 4);  // queries aligned to the end of the keys
  for (SequenceLayout layout : kLayouts)
    for (int r = 0; r < 3; ++r) {
      const std::optional<int64_t> run = run_start(layout_indices(layout, 50, 3, r));
      const bool one_run = layout == SequenceLayout::kContiguous || (layout == SequenceLayout::kZigzag && r == 2);
      if (one_run) EXPECT_EQ(run, layout_indices(layout, 50, 3, r).front()) << "rank " << r;
      else EXPECT_EQ(run, std::nullopt) << "rank " << r;
    }
}

std::vector<int64_t> run_of(int64_t first, int64_t count) {
  std::vector<int64_t> run(static_cast<size_t>(count));
  std::iota(run.begin(), run.end(), first);
  return run;
}

// Dropout's kernels hash once for keys k and k + 8 where a block's keys pair up so (dropout_keys_pair_up); the
// schedule answers once per layout what a scan of each block's keys says.
TEST(DropoutKeysPairUp, FindsKeysEightApartInEachSixteen) {
  EXPECT_TRUE(dropout_keys_pair_up(run_of(0, 40)));
  EXPECT_TRUE(dropout_keys_pair_up(run_of(16, 12)));  // a last sixteen cut short
  EXPECT_TRUE(dropout_keys_pair_up(run_of(32, 3)));
  EXPECT_FALSE(dropout_keys_pair_up(run_of(8, 40)));  // bit 3 set where the low key should be
  EXPECT_FALSE(dropout_keys_pair_up(run_of(3, 40)));
  std::vector<int64_t> gap = run_of(0, 8), high = run_of(24, 8);
  gap.insert(gap.end(), high.begin(), high.end());
  EXPECT_FALSE(dropout_keys_pair_up(gap));  // key 8 apart is 24, not 8
  for (SequenceLayout layout : kLayouts)
    for (int64_t len : {256, 200, 50})
      for (int ranks : {1, 2, 3}) {
        const RingSchedule s(layout, len, len, ranks, 0);
        for (int r = 0; r < ranks; ++r) {
          EXPECT_EQ(s.keys_pair_up(r), dropout_keys_pair_up(s.keys(r))) << len << " " << ranks << " " << r;
          // Contiguous and zigzag chunks of a multiple of 16 pair up; striped blocks of more than one rank do not.
          if (len == 256 && ranks == 2) {
            EXPECT_EQ(s.keys_pair_up(r), layout != SequenceLayout::kStriped) << r;
          }
        }
      }
}

// Random layouts, ring sizes, lengths (S != T either way, fewer tokens than ranks), masks and windows, and key
// ranges within a block (the GPU backward splits its own block in two): the kind equals the pairs'.
TEST(RingSchedule, KindsEqualEveryPairsOnRandomCases) {
  std::mt19937 rng(2026);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int skipped = 0, full = 0, partial = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const SequenceLayout layout = kLayouts[pick(0, 2)];
    const int n = pick(1, 6), rank = pick(0, n - 1);
    const int64_t kv_len = pick(0, 90), q_len = pick(0, 1) ? kv_len : pick(0, 90);
    AttentionParams p;
    p.causal = pick(0, 1);
    p.window_left = pick(0, 2) ? -1 : pick(0, 30);
    p.window_right = pick(0, 2) ? -1 : pick(0, 30);
    const RingSchedule s(layout, q_len, kv_len, n, rank);
    const int src = pick(0, n - 1);
    const int64_t rows = s.rows(src);
    const int64_t first = rows > 0 ? pick(0, int(rows) - 1) : 0;
    const int64_t count = pick(0, 1) ? -1 : pick(0, int(rows - first));
    const std::vector<int64_t>& keys = s.keys(src);
    const std::vector<int64_t> part(keys.begin() + first, count < 0 ? keys.end() : keys.begin() + first + count);
    const BlockKind want = kind_of_pairs(s.query_positions(), part, p);
    const BlockKind got = s.kind(src, p, first, count);
    ASSERT_EQ(int(got), int(want)) << layout_name(layout) << " T=" << q_len << " S=" << kv_len << " rank " << rank
                                   << " of " << n << " block of rank " << src << " keys [" << first << ", +" << count
                                   << ") causal=" << p.causal << " window=(" << p.window_left << ", "
                                   << p.window_right << ")";
    (got == BlockKind::kSkip ? skipped : got == BlockKind::kFull ? full : partial) += 1;
  }
  EXPECT_GT(skipped, 300);  // every kind drawn often
  EXPECT_GT(full, 300);
  EXPECT_GT(partial, 300);
}

// Blocks whose position ranges overlap although no pair is visible: the min / max over all positions
// computed them; classified per run they are skipped.
TEST(RingSchedule, SkipsBlocksWhoseRunsSeeNothing) {
  AttentionParams window;
  window.causal = true;
  window.window_left = 100;
  // Zigzag over 4 ranks of 4096: rank 0 holds [0, 512) and [3584, 4096); rank 2's block is
  // [1024, 1536) and [2560, 3072): in the future of the first run, beyond the window of the second.
  const RingSchedule zigzag(SequenceLayout::kZigzag, 4096, 4096, 4, 0);
  EXPECT_EQ(zigzag.kind(2, window), BlockKind::kSkip);
  EXPECT_EQ(classify_block(0, 4095, 1024, 3071, true, 100, -1), BlockKind::kPartial);  // by min / max
  EXPECT_EQ(zigzag.kind(3, window), BlockKind::kSkip);     // [1536, 2560): the same
  EXPECT_EQ(zigzag.kind(1, window), BlockKind::kPartial);  // [3072, 3584): the window of query 3584
  EXPECT_EQ(zigzag.kind(0, window), BlockKind::kPartial);
  AttentionParams diagonal;
  diagonal.window_left = diagonal.window_right = 0;  // each query sees its own key only
  const RingSchedule striped(SequenceLayout::kStriped, 64, 64, 4, 1);
  EXPECT_EQ(striped.kind(1, diagonal), BlockKind::kPartial);
  EXPECT_EQ(striped.kind(2, diagonal), BlockKind::kSkip);
}

}  // namespace
}  // namespace ra
