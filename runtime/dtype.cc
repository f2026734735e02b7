// dtype names, sizes and the f16 conversions (bit manipulation, portable to any host compiler).
#include "runtime/dtype.h"

#include <cmath>

#include "runtime/error.h"

namespace ra {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
  }
  RA_FAIL("unknown dtype");
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kU8: return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "f16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  RA_FAIL("dtype '", name, "' is not supported: expected f32, f16 or bf16");
}

double dtype_unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kF32: return std::ldexp(1.0, -24);
    case DType::kF16: return std::ldexp(1.0, -11);
    case DType::kBF16: return std::ldexp(1.0, -8);
    case DType::kF64: return std::ldexp(1.0, -53);
    default: return 0.0;
  }
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t word;
  if (exponent == 0x1f) {
    word = sign | 0x7f800000u | (mantissa << 13);  // inf / NaN
  } else if (exponent != 0) {
    word = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    word = sign;
  } else {  // subnormal: value = mantissa * 2^-24, exact in f32
    float value = std::ldexp(float(mantissa), -24);
    std::memcpy(&word, &value, 4);
    word |= sign;
  }
  float out;
  std::memcpy(&out, &word, 4);
  return out;
}

uint16_t f32_to_f16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, 4);
  uint16_t sign = uint16_t((word >> 16) & 0x8000u);
  uint32_t abs = word & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                        // below the smallest normal half: subnormal or zero
    float magnitude;
    std::memcpy(&magnitude, &abs, 4);
    // 2^-24 is the subnormal step; nearbyint rounds half to even in the default mode.
    return sign | uint16_t(std::nearbyint(magnitude * 16777216.0f));
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u) - (112u << 23);
  return sign | uint16_t(rounded >> 13);
}

void convert_to_f32(const void* src, DType src_dtype, float* dst, size_t n) {
  RA_CHECK(src_dtype == DType::kF32 || src_dtype == DType::kF16 || src_dtype == DType::kBF16,
           "cannot convert dtype ", dtype_name(src_dtype), " to f32");
  if (src_dtype == DType::kF32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = load_as_f32(src, src_dtype, i);
}

void convert_from_f32(const float* src, void* dst, DType dst_dtype, size_t n) {
  switch (dst_dtype) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      return;
    default: RA_FAIL("cannot convert f32 to dtype ", dtype_name(dst_dtype));
  }
}

}  // namespace ra
