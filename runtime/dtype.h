// Element types of tensors: f32, f16 and bf16 (the 16-bit types are stored, never accumulated in),
// with scalar conversions to and from f32 that round to nearest even.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ra {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI32, kU8 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
DType parse_dtype(std::string_view name);  // "f32" | "f16" | "bf16"; throws otherwise
// Unit roundoff of the type (half the distance from 1 to the next value): the basis of tolerances.
double dtype_unit_roundoff(DType dtype);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t word = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &word, 4);
  return value;
}

inline uint16_t f32_to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, 4);
  if ((word & 0x7fffffffu) > 0x7f800000u) return uint16_t((word >> 16) | 0x40);  // keep NaN a NaN
  word += 0x7fffu + ((word >> 16) & 1u);  // round to nearest even
  return uint16_t(word >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

// Reads element i of a buffer of f32/f16/bf16 as f32.
inline float load_as_f32(const void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: return 0.0f;
  }
}

// Converts n elements between f32 and a floating dtype (f32 copies).
void convert_to_f32(const void* src, DType src_dtype, float* dst, size_t n);
void convert_from_f32(const float* src, void* dst, DType dst_dtype, size_t n);

}  // namespace ra
