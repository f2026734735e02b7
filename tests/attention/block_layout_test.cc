// Where k, v and the segment ids sit in a K/V block in flight, and the gaps the ring zeroes.
#include <gtest/gtest.h>

#include "attention/ring.h"

namespace ra {
namespace {

TEST(KvBlockLayout, SectionsStartAlignedAndGapsCoverTheRest) {
  // k: 3 x 5 x 1 x 2 f32 = 120 bytes; v: 3 x 5 x 1 x 3 bf16 = 90 bytes; segment ids 3 x 5 i32 = 60 bytes.
  Tensor k(DType::kF32, {3, 5, 1, 2}), v(DType::kBF16, {3, 5, 1, 3}), segments(DType::kI32, {3, 5});
  AttentionInputs in;
  in.k = k, in.v = v, in.kv_segment_ids = segments;
  const KvBlockLayout layout(in, 256);
  EXPECT_EQ(layout.v_offset, 256u);
  EXPECT_EQ(layout.segments_offset, 512u);
  EXPECT_EQ(layout.payload, 768u);
  const std::vector<KvBlockLayout::Span> gaps = layout.padding(in);
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
  const KvBlockLayout layout(in, 1);
  EXPECT_EQ(layout.v_offset, k.view().nbytes());
  EXPECT_EQ(layout.payload, 2 * k.view().nbytes());
  EXPECT_TRUE(layout.padding(in).empty());
}

}  // namespace
}  // namespace ra
