// Where k, v and the segment ids sit in a K/V block in flight, and the gaps the ring zeroes.
#include <gtest/gtest.h>

#include "attention/ring/ring.h"

namespace ra {
namespace {

TEST(KvBlockLayout, SectionsStartAlignedAndGapsCoverTheRest) {
  // k: 3 x 5 x 1 x 2 f32 = 120 bytes; v: 3 x 5 x 1 x 3 bf16 = 90 bytes; segment ids 3 x 5 i32 = 60 bytes.
  Tensor k(DType::kF32, {3, 5, 1, 2}), v(DType::kBF16, {3, 5, 1, 3}), segments(DType::kI32, {3, 5});
  AttentionInputs in;
  in.k = k, in.v = v, in.kv_segment_ids = segments;
  const KvBlockLayout layout(in, 5, 256);
  EXPECT_EQ(layout.v_offset, 256u);
  EXPECT_EQ(layout.segments_offset, 512u);
  EXPECT_EQ(layout.payload, 768u);
  const std::vector<KvBlockLayout::Span> gaps = layout.padding(in, 5);
  ASSERT_EQ(gaps.size(), 3u);
  EXPECT_EQ(gaps[0].offset, 120u);
  EXPECT_EQ(gaps[0].bytes, 136u);
  EXPECT_EQ(gaps[1].offset, 346u);
  EXPECT_EQ(gaps[1].bytes, 166u);
  EXPECT_EQ(gaps[2].offset, 572u);
  EXPECT_EQ(gaps[2].bytes, 196u);
}

TEST(KvBlockLayout, PackedTightHasNoGaps) {
  Tensor k(DType::kF32, {1, 7, 2, 4}), v(DType::kF32, {1, 7, 2, 4});
  AttentionInputs in;
  in.k = k, in.v = v;
  const KvBlockLayout layout(in, 7, 1);
  EXPECT_EQ(layout.v_offset, k.view().nbytes());
  EXPECT_EQ(layout.payload, 2 * k.view().nbytes());
  EXPECT_TRUE(layout.padding(in, 7).empty());
}

// Shards of a length that does not divide: sections sized for the longest, a shorter block at the
// start of each, its unused rows among the gaps; its view has its own row count.
TEST(KvBlockLayout, ShortBlocksSitAtTheStartOfEachSection) {
  Tensor k(DType::kF32, {2, 4, 1, 2}), v(DType::kF32, {2, 4, 1, 2});  // 64 bytes each at 4 rows
  AttentionInputs in;
  in.k = k, in.v = v;
  const KvBlockLayout layout(in, 5, 1);  // the longest shard has 5 rows: 80 bytes a section
  EXPECT_EQ(layout.v_offset, 80u);
  EXPECT_EQ(layout.payload, 160u);
  const std::vector<KvBlockLayout::Span> gaps = layout.padding(in, 3);  // a block of 3 rows: 48 bytes each
  ASSERT_EQ(gaps.size(), 2u);
  EXPECT_EQ(gaps[0].offset, 48u);
  EXPECT_EQ(gaps[0].bytes, 32u);
  EXPECT_EQ(gaps[1].offset, 128u);
  EXPECT_EQ(gaps[1].bytes, 32u);
  char buffer[160];
  const AttentionInputs block = layout.view(in, buffer, 3, MemoryKind::kHost);
  EXPECT_EQ(block.k.shape(), (Shape{2, 3, 1, 2}));
  EXPECT_EQ(block.v.data(), buffer + 80);
  EXPECT_TRUE(layout.padding(in, 5).empty());
}

}  // namespace
}  // namespace ra
