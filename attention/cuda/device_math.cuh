// Small device helpers shared by the CUDA kernels: dtype loads and stores in f32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "runtime/dtype.h"

namespace ra {

__device__ __forceinline__ float load_as_f32(const void* base, int64_t index, DType dtype) {
  switch (dtype) {
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[index]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    case DType::kF64: return float(static_cast<const double*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

__device__ __forceinline__ void store_from_f32(void* base, int64_t index, DType dtype, float value) {
  switch (dtype) {
    case DType::kF16: static_cast<__half*>(base)[index] = __float2half_rn(value); break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value); break;
    case DType::kF64: static_cast<double*>(base)[index] = value; break;
    default: static_cast<float*>(base)[index] = value; break;
  }
}

// Element strides of a 4-D view, passed by value to kernels.
struct DeviceStrides4 {
  int64_t s[4];
};

inline unsigned blocks_for(int64_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace ra
