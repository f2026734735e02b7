// The wgmma backward's query-block dQ kernel, its f16 instances (a translation unit per dtype: see
// launch_flash_wgmma_dq).
#include "attention/cuda/flash_wgmma_dq_kernel.cuh"

namespace ra {
template void launch_flash_wgmma_dq<__half>(const FlashBackwardArgs& g, cudaStream_t stream);
}  // namespace ra
