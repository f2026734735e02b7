// dtype conversions: f16 and bf16 round trips over every bit pattern, rounding to nearest even,
// overflow, subnormals and NaN.
#include "runtime/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

#include "runtime/error.h"

namespace ra {
namespace {

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float f = f16_to_f32(uint16_t(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), uint16_t(bits)) << bits;
  }
}

TEST(DType, Bf16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float f = bf16_to_f32(uint16_t(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), uint16_t(bits)) << bits;
  }
}

TEST(DType, F16KnownValuesAndRounding) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie rounds to even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);  // overflow to inf
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
}

TEST(DType, NamesAndParse) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(dtype_name(DType::kF16), "f16");
  EXPECT_THROW(parse_dtype("f8"), Error);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
}

}  // namespace
}  // namespace ra
