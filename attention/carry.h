// The online-softmax carry of ring attention: for each query row (b, h, t), in f32,
//   numerator   = sum_j exp(s_j - max) * v_j   (Dv values)
//   denominator = sum_j exp(s_j - max)
//   max         = max_j s_j                    (the running max of the logits)
// LSE base: natural log. log-sum-exp = max + log(denominator). A row that has seen no key has
// max = -inf, denominator = 0, numerator = 0: merging with it is exact, finalizing it gives O = 0 and
// LSE = -inf.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace ra {

struct Carry {
  int64_t batch = 0, heads = 0, rows = 0, value_dim = 0;
  Tensor numerator;    // (B, Hq, T, Dv) f32
  Tensor denominator;  // (B, Hq, T) f32
  Tensor max;          // (B, Hq, T) f32

  // On a device the max's -inf is written by a kernel queued on `cuda_stream` (a cudaStream_t; nullptr:
  // the legacy default stream, then waited for, so that work on any stream sees it).
  static Carry empty(int64_t batch, int64_t heads, int64_t rows, int64_t value_dim,
                     MemoryKind memory = MemoryKind::kHost, void* cuda_stream = nullptr);
  // The carry of one call whose device work is queued on `cuda_stream`: on a device from ringattn's
  // cache of temporaries, zeroed there with no wait for the device (Tensor::temporary: it must die
  // while the stream lives, before the stream's later work reuses its memory).
  static Carry temporary(int64_t batch, int64_t heads, int64_t rows, int64_t value_dim, MemoryKind memory,
                         void* cuda_stream);
  MemoryKind memory() const { return numerator.view().memory(); }
  int64_t row_count() const { return batch * heads * rows; }
};

// Back to the empty carry (numerator 0, denominator 0, max -inf) without reallocating.
void reset(Carry& carry, void* cuda_stream = nullptr);

// into <- into (+) other: the carry of the union of both key sets. Exact when either side is empty.
// other's rows land at rows [row_offset, row_offset + other.rows) of into (blockwise query chunks).
// Device carries are merged on `cuda_stream` (a cudaStream_t; nullptr: the legacy default stream).
void merge(Carry& into, const Carry& other, int64_t row_offset = 0, void* cuda_stream = nullptr);

// O (B, T, Hq, Dv) in o's dtype and LSE (B, Hq, T) f32 from a carry. `sinks` (Hq f32, optional): one
// extra logit per head that joins the denominator only (attention sinks), counted once here.
// A device carry needs o, lse and sinks in device memory and runs on `cuda_stream`.
void finalize(const Carry& carry, const TensorView& sinks, const TensorView& o, const TensorView& lse,
              void* cuda_stream = nullptr);

}  // namespace ra
