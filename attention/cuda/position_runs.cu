// Token positions written on the device where they are runs (each the first plus its index): a call
// captured into a CUDA graph cannot copy them from host memory, which a replay would read again then.
#include "attention/cuda/cuda_inputs.h"

namespace ra {
namespace {

__global__ void fill_position_runs_kernel(int64_t* out, int64_t q_count, int64_t q_first, int64_t k_count,
                                          int64_t k_first) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < q_count) out[i] = q_first + i;
  else if (i < q_count + k_count) out[i] = k_first + (i - q_count);
}

}  // namespace

void fill_position_runs_cuda(int64_t* out, int64_t q_count, int64_t q_first, int64_t k_count, int64_t k_first,
                             cudaStream_t stream) {
  const int64_t n = q_count + k_count;
  if (n == 0) return;
  fill_position_runs_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(out, q_count, q_first, k_count, k_first);
  RA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ra
