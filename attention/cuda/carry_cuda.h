// The carry's operations on the device: merge two carries, fold a finished (O, LSE) block into a
// carry, and finalize a carry into O and LSE. All NaN-safe for empty rows and blocks, as on the host.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/carry.h"

namespace ra {

// Numerator and denominator 0, max -inf, queued on `stream`.
void reset_carry_cuda(Carry& carry, cudaStream_t stream);

// Max -inf (a new carry, its numerator and denominator already zero), queued on `stream`; on the legacy
// default stream (nullptr) also waited for.
void fill_carry_max_cuda(Carry& carry, cudaStream_t stream);

// into <- into (+) other, other's rows landing at row_offset (as ra::merge).
void merge_carry_cuda(Carry& into, const Carry& other, int64_t row_offset, cudaStream_t stream);

// into <- into (+) the block whose normalised output is o (B, T, Hq, Dv, any float dtype, device) and
// whose log-sum-exp is lse (B, Hq, T) f32: the block is the carry {max = lse, denominator = 1,
// numerator = o}. lse = -inf marks an empty block row and contributes nothing.
// The block covers rows [row_offset, row_offset + o.dim(1)) of the carry.
void fold_output_lse_cuda(Carry& into, const TensorView& o, const TensorView& lse, int64_t row_offset,
                          cudaStream_t stream);

// O (B, T, Hq, Dv) in o's dtype and LSE (B, Hq, T) f32, with optional sinks (Hq f32), on the device.
void finalize_cuda(const Carry& carry, const TensorView& sinks, const TensorView& o, const TensorView& lse,
                   cudaStream_t stream);

}  // namespace ra
