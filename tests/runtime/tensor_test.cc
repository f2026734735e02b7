// Shapes, views, narrowing and numpy-style broadcasting.
#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra {
namespace {

TEST(Tensor, ContiguousStridesAndNarrow) {
  Tensor t(DType::kF32, {2, 3, 4});
  EXPECT_EQ(t.view().stride(0), 12);
  EXPECT_TRUE(t.view().is_contiguous());
  TensorView n = narrow(t, 1, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(n.data_as<float>(), t.data<float>() + 4);
  EXPECT_FALSE(n.is_contiguous());
  EXPECT_THROW(narrow(t, 1, 2, 2), Error);
}

// A dimension of one element takes the stride a contiguous view would have, whatever the caller gave (PyTorch keeps a
// broadcast's 0 there through contiguous(), NumPy a negative one): the view is then contiguous where the rest is, and
// the GPU kernels' TMA maps and cuDNN, which need positive strides, take it. Dimensions of more elements keep theirs.
TEST(Tensor, OneElementDimensionsTakeContiguousStrides) {
  Tensor t(DType::kBF16, {5, 4, 8});
  const TensorView q(t.data<uint16_t>(), DType::kBF16, Shape{1, 5, 4, 8}, {0, 32, 8, 1});
  EXPECT_EQ(q.strides(), (std::array<int64_t, kMaxRank>{160, 32, 8, 1}));
  EXPECT_TRUE(q.is_contiguous());
  const TensorView k(t.data<uint16_t>(), DType::kBF16, Shape{5, 1, 1, 8}, {32, -3, 0, 1});
  EXPECT_EQ(k.stride(0), 32);
  EXPECT_EQ(k.stride(1), 8);
  EXPECT_EQ(k.stride(2), 8);
  EXPECT_FALSE(k.is_contiguous());  // rows 32 apart, not 8
  const TensorView broadcast(t.data<uint16_t>(), DType::kBF16, Shape{3, 5, 4, 8}, {0, 32, 8, 1});
  EXPECT_EQ(broadcast.stride(0), 0);
  EXPECT_EQ(TensorView(t.data<uint16_t>(), DType::kBF16, Shape{2, 1}, {1, 7}).stride(1), 1);
}

// Views meet where their byte spans do: neighbours apart, a row inside its tensor, a reversed view at both
// ends, the two halves of a tensor apart, and an empty view nowhere.
TEST(Tensor, SpansMeetWhereViewsShareBytes) {
  Tensor t(DType::kF32, {4, 6});
  const TensorView whole = t.view();
  EXPECT_TRUE(spans_meet(whole, whole));
  EXPECT_TRUE(spans_meet(whole, narrow(whole, 0, 2, 1)));
  EXPECT_FALSE(spans_meet(narrow(whole, 0, 0, 2), narrow(whole, 0, 2, 2)));
  EXPECT_TRUE(spans_meet(narrow(whole, 0, 0, 3), narrow(whole, 0, 2, 2)));
  const TensorView reversed(t.data<float>() + 23, DType::kF32, Shape{4, 6}, {-6, -1});
  EXPECT_TRUE(spans_meet(reversed, narrow(whole, 0, 0, 1)));
  EXPECT_TRUE(spans_meet(reversed, narrow(whole, 0, 3, 1)));
  Tensor other(DType::kF32, {4, 6});
  EXPECT_FALSE(spans_meet(whole, other.view()));
  EXPECT_FALSE(spans_meet(whole, narrow(whole, 0, 1, 0)));
  EXPECT_FALSE(spans_meet(whole, TensorView()));
}

TEST(Tensor, BroadcastGivesZeroStrides) {
  Tensor t(DType::kF32, {1, 4, 1, 5});
  TensorView b = broadcast_to(t, Shape{2, 4, 3, 5}, "bias");
  EXPECT_EQ(b.stride(0), 0);
  EXPECT_EQ(b.stride(1), 5);
  EXPECT_EQ(b.stride(2), 0);
  Tensor low(DType::kF32, {3, 5});
  EXPECT_EQ(broadcast_to(low, Shape{2, 4, 3, 5}, "bias").stride(2), 5);
}

TEST(Tensor, BroadcastErrorNamesTensorAndDimension) {
  Tensor t(DType::kU8, {2, 1, 7, 5});
  try {
    broadcast_to(t, Shape{2, 4, 3, 5}, "mask");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "mask dimension 2 is 7 (shape (2, 1, 7, 5)), expected 1 or 3 to broadcast to (2, 4, 3, 5)");
  }
}

// On the host a call's temporary is an ordinary zeroed tensor, and the device cache holds nothing (it
// has none without CUDA, and none before a device temporary; emptying it is always allowed).
TEST(Tensor, HostTemporariesAreZeroedAndLeaveTheDeviceCacheEmpty) {
  const Tensor t = Tensor::temporary(DType::kF32, {3, 5}, MemoryKind::kHost, nullptr);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
  EXPECT_EQ(device_cache_bytes(), 0u);
  release_device_cache();
}

// An allocation that fails names what it was for: the tensor's dtype and shape, and the bytes asked.
TEST(Tensor, FailedAllocationNamesDtypeShapeAndBytes) {
  try {
    Tensor huge(DType::kF32, {int64_t(1) << 60}, MemoryKind::kHost);
    FAIL() << "a host allocation of 4 EiB succeeded";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("an f32 tensor of shape (1152921504606846976)"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("4611686018427387904 bytes"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace ra
