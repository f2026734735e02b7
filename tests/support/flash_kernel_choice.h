// Test helpers for the CUDA flash kernels' choice (mma.sync or wgmma, both passes).
#pragma once

#include "attention/cuda/flash_cuda.h"

namespace ra::test {

// Sets the flash kernel for one test and restores the previous choice.
class ScopedFlashKernel {
 public:
  explicit ScopedFlashKernel(FlashCudaKernel k) : saved_(flash_cuda_kernel()) { set_flash_cuda_kernel(k); }
  ~ScopedFlashKernel() { set_flash_cuda_kernel(saved_); }
  ScopedFlashKernel(const ScopedFlashKernel&) = delete;
  ScopedFlashKernel& operator=(const ScopedFlashKernel&) = delete;

 private:
  FlashCudaKernel saved_;
};

inline const char* kernel_name(FlashCudaKernel k) {
  return k == FlashCudaKernel::kWgmma ? "wgmma" : k == FlashCudaKernel::kMmaSync ? "mma_sync" : "auto";
}

}  // namespace ra::test
