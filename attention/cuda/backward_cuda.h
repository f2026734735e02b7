// The backward's per-call pieces on the device (attention/backward.h): delta, the sinks' gradient and
// the f32 -> input dtype conversion of the gradients.
#pragma once

#include <cuda_runtime_api.h>

#include "runtime/tensor.h"

namespace ra {

// delta (B, H, T) f32 = rowsum(dO * O) - d_lse; o and d_o (B, T, H, Dv), any float dtypes, any strides; d_lse
// (B, H, T) f32 contiguous, or undefined. `zero`, where given (f32 (B, T, H, D), contiguous, D a multiple of 4: the
// backward's dQ accumulator), is set to zeros in the same pass, costing less than a memset of its own.
void compute_delta_cuda(const TensorView& o, const TensorView& d_o, const TensorView& d_lse, const TensorView& delta,
                        cudaStream_t stream, const TensorView& zero = TensorView());
// dsinks (H) f32 = -sum over (b, t) of exp(sink_h - lse) * delta.
void sinks_gradient_cuda(const TensorView& sinks, const TensorView& lse, const TensorView& delta,
                         const TensorView& dsinks, cudaStream_t stream);
// out (any float dtype) <- in (f32), both contiguous with the same element count.
void convert_f32_cuda(const TensorView& in, const TensorView& out, cudaStream_t stream);

// into (f32, strided: rows of a larger accumulator) += from (any float dtype, contiguous), both
// (B, L, H, X); atomic: by atomics, where kernels on other streams may add into the same rows meanwhile.
void add_rows_cuda(const TensorView& into, const TensorView& from, cudaStream_t stream, bool atomic = false);
// into <- from, as add_rows_cuda writes but without reading into (rows nothing was added to yet).
void write_rows_cuda(const TensorView& into, const TensorView& from, cudaStream_t stream);
// into (f32, (B, L, H, X), rows of H x X contiguous floats) <- 0.
void zero_rows_cuda(const TensorView& into, cudaStream_t stream);

// out (any float dtype) <- sum (f32) + addend (any float dtype), all contiguous with one element count, in
// one pass where they are in aligned rows of 4 (else sum is added into, then converted: sum changes).
void add_convert_cuda(const TensorView& sum, const TensorView& addend, const TensorView& out, cudaStream_t stream);

// into += slices[0] + slices[1] + ... + slices[count - 1], added in that order (n f32 each, the slices one
// after another, n % 4 == 0, 16-byte aligned): the deterministic backward's dQ slices.
void add_slices_cuda(float* into, const float* slices, int count, int64_t n, cudaStream_t stream);

// A copy of an f32 LSE with -inf (rows that saw no key) replaced by +inf, in `scratch` (grow-only: no
// allocation, and so no device-wide wait in cudaFree, once it is large enough): kernels that recompute
// P = exp(S - LSE) then give P = 0 there instead of exp(+inf).
TensorView finite_or_positive_infinity(const TensorView& lse, Tensor& scratch, cudaStream_t stream);

}  // namespace ra
