// The CUDA sdpa: scores materialised by cuBLAS f32 GEMMs (no TF32), a softmax kernel that applies
// every option and folds the rows into the carry, and a second GEMM for P V. Slow on purpose and
// simple: it is the seeds' SDPA and the GPU tests' second, independent reference.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "attention/backward.h"
#include "attention/cuda/cuda_inputs.h"

namespace ra {

class SdpaCudaRunner {
 public:
  SdpaCudaRunner();
  ~SdpaCudaRunner();
  SdpaCudaRunner(const SdpaCudaRunner&) = delete;
  SdpaCudaRunner& operator=(const SdpaCudaRunner&) = delete;
  // `in` gives the dtypes (any float dtype) of the tensors that `args` points to.
  void accumulate(const AttentionInputs& in, const CudaAttentionArgs& args, cudaStream_t stream) const;
  // The backward (attention/backward.h) the same way: per (batch, head, query chunk), cuBLAS f32 GEMMs
  // for Q K^T and dO V^T, a kernel for P and dS with every option, GEMMs adding dV, dK and dQ.
  void accumulate_backward(const AttentionInputs& in, const CudaAttentionArgs& args, const BackwardInputs& grad,
                           const GradViews& acc, cudaStream_t stream) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ra
