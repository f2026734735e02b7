// Four consecutive elements of a float dtype as f32, and back: the row kernels (backward_cuda.cu, carry_cuda.cu) move
// 16-byte (f32) or 8-byte (16-bit) words where rows allow, as scalar loads and stores ran at a quarter of HBM's rate.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/error.h"

namespace ra {

template <typename T>
struct Quad;
template <>
struct Quad<float> {
  static __device__ __forceinline__ float4 load(const float* p) { return *reinterpret_cast<const float4*>(p); }
  static __device__ __forceinline__ void store(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
};
template <>
struct Quad<double> {
  static __device__ __forceinline__ float4 load(const double* p) {
    const double2 lo = reinterpret_cast<const double2*>(p)[0], hi = reinterpret_cast<const double2*>(p)[1];
    return make_float4(float(lo.x), float(lo.y), float(hi.x), float(hi.y));
  }
  static __device__ __forceinline__ void store(double* p, float4 v) {
    reinterpret_cast<double2*>(p)[0] = make_double2(v.x, v.y), reinterpret_cast<double2*>(p)[1] = make_double2(v.z, v.w);
  }
};
template <typename T2, typename T, T2 (*pack)(float2), float2 (*unpack)(T2)>
struct Quad16 {
  static __device__ __forceinline__ float4 load(const T* p) {
    const uint2 word = *reinterpret_cast<const uint2*>(p);
    const float2 lo = unpack(*reinterpret_cast<const T2*>(&word.x)), hi = unpack(*reinterpret_cast<const T2*>(&word.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  static __device__ __forceinline__ void store(T* p, float4 v) {
    const T2 lo = pack(make_float2(v.x, v.y)), hi = pack(make_float2(v.z, v.w));
    *reinterpret_cast<uint2*>(p) =
        make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
  }
};
__device__ __forceinline__ __nv_bfloat162 pack_bf16(float2 v) { return __float22bfloat162_rn(v); }
__device__ __forceinline__ float2 unpack_bf16(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ __half2 pack_f16(float2 v) { return __float22half2_rn(v); }
__device__ __forceinline__ float2 unpack_f16(__half2 v) { return __half22float2(v); }
template <>
struct Quad<__nv_bfloat16> : Quad16<__nv_bfloat162, __nv_bfloat16, pack_bf16, unpack_bf16> {};
template <>
struct Quad<__half> : Quad16<__half2, __half, pack_f16, unpack_f16> {};

__device__ __forceinline__ float element_f32(float x) { return x; }
__device__ __forceinline__ float element_f32(double x) { return float(x); }
__device__ __forceinline__ float element_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float element_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ void store_element(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_element(double* p, float v) { *p = v; }
__device__ __forceinline__ void store_element(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_element(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Elements first .. first + 3 of a row `stride` apart, as a quad: those at or past `count` are 0.
template <typename T>
__device__ __forceinline__ float4 quad_of_elements(const T* row, int64_t first, int64_t stride, int64_t count) {
  float x[4];
  for (int i = 0; i < 4; ++i) x[i] = first + i < count ? element_f32(row[(first + i) * stride]) : 0.0f;
  return make_float4(x[0], x[1], x[2], x[3]);
}

// Whether p lies on a multiple of `bytes` (a quad's load or store needs 4 elements' alignment).
inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Calls f with a null pointer of the element type of f32, bf16 and f16 (true), else nothing (false).
template <typename F>
bool with_quad_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: f(static_cast<float*>(nullptr)); return true;
    case DType::kBF16: f(static_cast<__nv_bfloat16*>(nullptr)); return true;
    case DType::kF16: f(static_cast<__half*>(nullptr)); return true;
    default: return false;
  }
}

// f(T*) (a null pointer) with T the CUDA element type of a float dtype; other dtypes are refused naming `what`.
template <typename F>
void with_float_type(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kF32: return f(static_cast<float*>(nullptr));
    case DType::kF64: return f(static_cast<double*>(nullptr));
    case DType::kBF16: return f(static_cast<__nv_bfloat16*>(nullptr));
    case DType::kF16: return f(static_cast<__half*>(nullptr));
    default: RA_FAIL(what, " has dtype ", dtype_name(dtype), "; it takes f32, f64, bf16 or f16");
  }
}

}  // namespace ra
