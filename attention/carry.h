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
  HostTensor numerator;    // (B, Hq, T, Dv) f32
  HostTensor denominator;  // (B, Hq, T) f32
  HostTensor max;          // (B, Hq, T) f32

  static Carry empty(int64_t batch, int64_t heads, int64_t rows, int64_t value_dim);
  int64_t row_count() const { return batch * heads * rows; }
};

// into <- into (+) other: the carry of the union of both key sets. Exact when either side is empty.
// other's rows land at rows [row_offset, row_offset + other.rows) of into (blockwise query chunks).
void merge(Carry& into, const Carry& other, int64_t row_offset = 0);

// O (B, T, Hq, Dv) in o's dtype and LSE (B, Hq, T) f32 from a carry. `sinks` (Hq f32, optional): one
// extra logit per head that joins the denominator only (attention sinks), counted once here.
void finalize(const Carry& carry, const TensorView& sinks, const TensorView& o, const TensorView& lse);

}  // namespace ra
