// The wgmma backward at D = 192 and 256 with dQ apart: the key-block kernel forms dK and dV only
// (kDqApart), then flash_wgmma_dq_kernel.cuh's query-block kernel forms dQ (no atomics per key block, which
// bound the key-block kernel there). Deterministic as it is: each key row's dK / dV and each query row's dQ
// have one writer, so --deterministic takes this path too.
#include <cuda_runtime.h>

#include "attention/cuda/dispatch.cuh"
#include "attention/cuda/flash_wgmma_backward.h"
#include "attention/cuda/flash_wgmma_backward_kernel.cuh"
#include "runtime/cuda_device.h"

namespace ra {

// flash_wgmma_dq_kernel.cuh, instantiated in flash_wgmma_dq_bf16.cu and flash_wgmma_dq_f16.cu.
template <typename T>
void launch_flash_wgmma_dq(const FlashBackwardArgs& g, cudaStream_t stream);

namespace {

template <typename T, int D>
void launch_dq_apart(FlashBackwardArgs g, cudaStream_t stream) {
  using KeyTraits = wgmma_backward::WgmmaBackwardTraits<T, D>;
  g.first_key_block = 0;
  g.dq_slice_size = 0;
  auto key_kernel = wgmma_backward::flash_wgmma_backward_kernel<T, D, false, false, false, false, false, true>;
  launch_flash_backward(reinterpret_cast<const void*>(key_kernel), wgmma_backward::with_step_maps<T, KeyTraits>(g),
                        KeyTraits::kBlockN, wgmma_backward::kThreads, KeyTraits::kSmemBytes, nullptr, stream);
  launch_flash_wgmma_dq<T>(g, stream);
}

}  // namespace

bool flash_wgmma_backward_dq_apart(const CudaAttentionArgs& a) {
  return (a.head_dim == 192 || a.head_dim == 256) && a.value_dim == a.head_dim && !flash_has_extras(a) &&
         a.soft_cap <= 0.0f && !a.q_segment_ranges;
}

void flash_wgmma_backward_with_dq_apart(const FlashBackwardArgs& g, DType dtype, cudaStream_t stream) {
  dispatch_half_dtype(dtype, "the wgmma flash_attn2 backward", [&](auto element) {
    dispatch_head_dim<192, 256>(g.a.head_dim, "the wgmma backward with dQ apart", [&](auto dim) {
      launch_dq_apart<decltype(element), decltype(dim)::value>(g, stream);
    });
  });
}

}  // namespace ra
