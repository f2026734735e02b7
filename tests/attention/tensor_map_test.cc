// encode_row_tiles (attention/cuda/tensor_map.h): the TMA maps of the wgmma kernels' tiles. A view TMA can
// address is mapped; one it cannot (rows not a multiple of 16 bytes apart, an address off 16 bytes, a last
// stride other than 1) is refused with false rather than handed to the copy engine, which would fault on
// the device. Skips without a GPU (the encoder is the driver's).
#include <gtest/gtest.h>

#include "attention/cuda/tensor_map.h"
#include "runtime/cuda_device.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace ra::test {
namespace {

TEST(TensorMap, MapsWhatTmaCanAddressAndRefusesTheRest) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 2, T = 100, H = 3, D = 64;
  Tensor t(DType::kBF16, {B, T, H, D}, MemoryKind::kCuda);
  const DeviceView4 view{t.data<unsigned char>(), {T * H * D, H * D, D, 1}};
  CUtensorMap map{};
  // Rows past T and columns past 40 of a 64-column box load as zeros: a narrower head dim maps too.
  EXPECT_TRUE(encode_row_tiles(map, view, TileElement::kBF16, B, T, H, D, 64, 64, 128));
  EXPECT_TRUE(encode_row_tiles(map, view, TileElement::kF16, B, T, H, 40, 128, 64, 128));
  EXPECT_TRUE(encode_row_tiles(map, view, TileElement::kBF16, B, T, H, D, 64, 32, 64));

  DeviceView4 rows_off = view;
  rows_off.stride[1] = H * D + 1;  // 386 bytes between rows
  EXPECT_FALSE(encode_row_tiles(map, rows_off, TileElement::kBF16, B, T, H, D, 64, 64, 128));
  DeviceView4 address_off = view;
  address_off.data = t.data<unsigned char>() + 2;
  EXPECT_FALSE(encode_row_tiles(map, address_off, TileElement::kBF16, B, T, H, D, 64, 64, 128));
  DeviceView4 strided_columns = view;
  strided_columns.stride[3] = 2;
  EXPECT_FALSE(encode_row_tiles(map, strided_columns, TileElement::kBF16, B, T, H, D, 64, 64, 128));
  // The kernels' launchers take the throwing form, which names the tensor.
  EXPECT_NO_THROW(row_tiles_of("q", view, TileElement::kBF16, B, T, H, D, 64, 64, 128));
  EXPECT_THROW(row_tiles_of("do", rows_off, TileElement::kBF16, B, T, H, D, 64, 64, 128), Error);

  // A box whose row of columns is not one swizzle row is a caller's mistake: refused loudly.
  EXPECT_THROW(encode_row_tiles(map, view, TileElement::kBF16, B, T, H, D, 64, 32, 128), Error);
  EXPECT_THROW(encode_row_tiles(map, view, TileElement::kF32, B, T, H, D, 64, 64, 128), Error);
}

}  // namespace
}  // namespace ra::test
