// Test helpers for the CUDA flash kernels' choice (mma.sync or wgmma, both passes).
#pragma once

#include <vector>

#include "attention/cuda/flash_cuda.h"
#include "tests/support/problem.h"

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

// The option sets both flash kernels run (the wgmma ones look only at positions): none, causal,
// window, sinks, causal with window.
inline std::vector<Options> positional_option_sets() {
  std::vector<Options> sets(5);
  sets[1].causal = true;
  sets[2].window = true;
  sets[3].sinks = true;
  sets[4].causal = sets[4].window = true;
  return sets;
}

}  // namespace ra::test
