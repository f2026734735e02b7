// Pure functions of the mesh: axes and coordinates, PartitionSpec / NamedSharding slices, sequence
// layouts (the ring's schedule over them: tests/attention/ring_schedule_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "mesh/mesh_shape.h"
#include "mesh/sequence_layout.h"
#include "mesh/sharding.h"
#include "runtime/error.h"

namespace ra {
namespace {

TEST(MeshShape, ParsesAxesAndMapsCoordinates) {
  MeshShape m = MeshShape::parse("dp=2,sp=3");
  EXPECT_EQ(m.size(), 6);
  EXPECT_EQ(m.axis_size("sp"), 3);
  EXPECT_EQ(m.coords(4), (std::vector<int>{1, 1}));
  for (int r = 0; r < 6; ++r) EXPECT_EQ(m.rank_of(m.coords(r)), r);
  EXPECT_EQ(m.str(), "dp=2,sp=3");
}

// Every axis partitions the ranks into groups of the axis' size, keyed 0..size-1 in coordinate order,
// and two ranks share a group exactly when they agree on every other coordinate.
TEST(MeshShape, AxisGroupsPartitionTheRanks) {
  MeshShape m = MeshShape::parse("dp=2,sp=3,tp=2");
  for (int a = 0; a < m.axis_count(); ++a) {
    std::map<int, std::vector<int>> keys_by_color;
    for (int r = 0; r < m.size(); ++r) {
      const MeshShape::AxisGroup g = m.axis_group(r, a);
      EXPECT_EQ(g.key, m.coords(r)[size_t(a)]);
      keys_by_color[g.color].push_back(g.key);
      for (int other = 0; other < m.size(); ++other) {
        std::vector<int> x = m.coords(r), y = m.coords(other);
        x[size_t(a)] = y[size_t(a)] = 0;
        EXPECT_EQ(m.axis_group(other, a).color == g.color, x == y) << "axis " << a << " ranks " << r << ", " << other;
      }
    }
    EXPECT_EQ(int(keys_by_color.size()), m.size() / m.axis_size(a));
    for (const auto& [color, keys] : keys_by_color) {
      std::vector<int> expected(size_t(m.axis_size(a)));
      std::iota(expected.begin(), expected.end(), 0);
      EXPECT_EQ(keys, expected) << "axis " << a << " color " << color;
    }
  }
}

TEST(MeshShape, RejectsBadText) {
  EXPECT_THROW(MeshShape::parse("sp=0"), Error);
  EXPECT_THROW(MeshShape::parse("sp=-1"), Error);
  EXPECT_THROW(MeshShape::parse("sp"), Error);
  EXPECT_THROW(MeshShape::parse("sp=2,sp=2"), Error);
  EXPECT_THROW(MeshShape::parse("sp=4x"), Error);
  EXPECT_THROW(MeshShape::parse("a=2044564350,b=2"), Error);  // found by the CLI fuzz target: int overflow
  EXPECT_THROW(MeshShape::parse("sp=99999999999"), Error);
}

TEST(Sharding, SlicesByAxes) {
  MeshShape m = MeshShape::parse("dp=2,tp=2");
  NamedSharding s(m, PartitionSpec::parse("dp,_,tp,_"));
  LocalSlice slice = s.local_slice(Shape{4, 10, 8, 64}, 3, "q");
  EXPECT_EQ(slice.offset, (std::vector<int64_t>{2, 0, 4, 0}));
  EXPECT_EQ(slice.extent, (std::vector<int64_t>{2, 10, 4, 64}));
  NamedSharding both(m, PartitionSpec{{"dp", "tp"}, {}, {}, {}});
  EXPECT_EQ(both.local_slice(Shape{8, 1, 1, 1}, 3, "x").offset[0], 6);
}

TEST(Sharding, RejectsShapesThatDoNotDivide) {
  NamedSharding s(MeshShape::parse("tp=3"), PartitionSpec::parse("_,_,tp,_"));
  try {
    s.local_slice(Shape{1, 8, 8, 64}, 0, "k");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "k dimension 2 has size 8, which does not divide over mesh axis 'tp' of size 3");
  }
  EXPECT_THROW(NamedSharding(MeshShape::parse("sp=2"), PartitionSpec::parse("dp")), Error);
}

class Layouts : public testing::TestWithParam<SequenceLayout> {};

// Any length on any number of ranks, lengths that do not divide and lengths below the ranks included:
// every token exactly once, shards within one token (two for zigzag's two chunks) of each other.
TEST_P(Layouts, PartitionEveryTokenExactlyOnce) {
  for (int n : {1, 2, 3, 4, 5, 8})
    for (int64_t length : {int64_t(0), int64_t(1), int64_t(3), int64_t(7), int64_t(24) * n, int64_t(97), int64_t(1001)}) {
      std::vector<int64_t> all;
      int64_t fewest = length, most = 0;
      for (int r = 0; r < n; ++r) {
        auto idx = layout_indices(GetParam(), length, n, r);
        EXPECT_EQ(int64_t(idx.size()), layout_rows(GetParam(), length, n, r));
        fewest = std::min(fewest, int64_t(idx.size())), most = std::max(most, int64_t(idx.size()));
        all.insert(all.end(), idx.begin(), idx.end());
      }
      EXPECT_EQ(most, layout_max_rows(GetParam(), length, n));
      EXPECT_LE(most - fewest, GetParam() == SequenceLayout::kZigzag ? 2 : 1) << "L=" << length << " N=" << n;
      std::sort(all.begin(), all.end());
      std::vector<int64_t> expect(static_cast<size_t>(length));
      std::iota(expect.begin(), expect.end(), 0);
      EXPECT_EQ(all, expect) << "L=" << length << " N=" << n;
      if (n == 1) {
        EXPECT_EQ(layout_indices(GetParam(), length, 1, 0), expect) << "one rank: the identity";
      }
    }
}

INSTANTIATE_TEST_SUITE_P(All, Layouts,
                         testing::Values(SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped),
                         [](const auto& info) { return std::string(layout_name(info.param)); });

TEST(Layouts, ZigzagHoldsChunksRAndMirror) {
  EXPECT_EQ(layout_indices(SequenceLayout::kZigzag, 8, 2, 0), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(layout_indices(SequenceLayout::kZigzag, 8, 2, 1), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(layout_indices(SequenceLayout::kStriped, 8, 4, 1), (std::vector<int64_t>{1, 5}));
  // Uneven: 2N = 4 chunks of 7 tokens are 1, 2, 2, 2 long; striped leaves rank 2 of 3 one short.
  EXPECT_EQ(layout_indices(SequenceLayout::kZigzag, 7, 2, 0), (std::vector<int64_t>{0, 5, 6}));
  EXPECT_EQ(layout_indices(SequenceLayout::kZigzag, 7, 2, 1), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(layout_indices(SequenceLayout::kStriped, 7, 3, 2), (std::vector<int64_t>{2, 5}));
  EXPECT_TRUE(layout_runs(SequenceLayout::kContiguous, 2, 4, 0).empty());  // fewer tokens than ranks
}

// Lengths a corrupt file can declare: the runs still cover [0, length) exactly (no 64-bit overflow).
TEST(Layouts, HugeLengthsSplitWithoutOverflow) {
  const int64_t length = 4395513236313604112;  // the fuzzer's: 3 * length overflowed
  for (SequenceLayout layout : {SequenceLayout::kContiguous, SequenceLayout::kZigzag, SequenceLayout::kStriped})
    for (int parts : {1, 2, 3, 7}) {
      int64_t rows = 0;
      for (int i = 0; i < parts; ++i) {
        for (const IndexRun& run : layout_runs(layout, length, parts, i)) {
          EXPECT_GE(run.start, 0);
          EXPECT_LT(run.start, length);
        }
        rows += layout_rows(layout, length, parts, i);
      }
      EXPECT_EQ(rows, length) << layout_name(layout) << " over " << parts;
    }
}

TEST(Layouts, ZigzagBalancesCausalWork) {
  // Visible (query, key) pairs per rank under a causal mask: equal for zigzag, not for contiguous.
  const int n = 4;
  const int64_t length = 64;
  auto work = [&](SequenceLayout layout, int r) {
    int64_t pairs = 0;
    for (int64_t q : layout_indices(layout, length, n, r)) pairs += q + 1;
    return pairs;
  };
  for (int r = 1; r < n; ++r) EXPECT_EQ(work(SequenceLayout::kZigzag, r), work(SequenceLayout::kZigzag, 0));
  EXPECT_GT(work(SequenceLayout::kContiguous, 3), 3 * work(SequenceLayout::kContiguous, 0));
}

}  // namespace
}  // namespace ra
