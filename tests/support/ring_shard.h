// One rank's share of a global test problem under the ring's layout (the MPI ring tests).
#pragma once

#include <cstring>
#include <vector>

#include "attention/ring/ring.h"
#include "mesh/sequence_layout.h"
#include "tests/support/problem.h"

namespace ra::test {

// Rows `idx` of dimension `dim` of a contiguous tensor, as a new contiguous tensor.
inline Tensor take(const Tensor& t, int dim, const std::vector<int64_t>& idx) {
  if (!t.defined()) return {};
  Shape shape = t.shape();
  if (shape[dim] == 1) {  // broadcast dimension: keep it whole
    Tensor copy(t.dtype(), shape);
    std::memcpy(copy.view().data(), t.view().data(), t.view().nbytes());
    return copy;
  }
  shape[dim] = int64_t(idx.size());
  Tensor out(t.dtype(), shape);
  const auto in_strides = contiguous_strides(t.shape());
  int64_t outer = 1, inner = in_strides[dim];
  for (int d = 0; d < dim; ++d) outer *= t.shape()[d];
  const size_t elem = dtype_size(t.dtype());
  const char* src = static_cast<const char*>(t.view().data());
  char* dst = static_cast<char*>(out.view().data());
  for (int64_t o = 0; o < outer; ++o)
    for (size_t i = 0; i < idx.size(); ++i)
      std::memcpy(dst + ((o * int64_t(idx.size()) + int64_t(i)) * inner) * int64_t(elem),
                  src + ((o * t.shape()[dim] + idx[i]) * inner) * int64_t(elem), size_t(inner) * elem);
  return out;
}

// One rank's rows of a global problem under the ring's layout, and the inputs viewing them.
struct Shard {
  Shard(const Problem& global, const RingContext& ctx) : pos(ring_positions(ctx)) {
    q_rows = layout_indices(ctx.layout, ctx.global_q_len, ctx.comm->size(), ctx.comm->rank());
    q = take(global.q, 1, q_rows), k = take(global.k, 1, pos.k), v = take(global.v, 1, pos.k);
    bias = take(global.bias, 2, q_rows), mask = take(global.mask, 2, q_rows);
    qs = take(global.q_seg, 1, q_rows), ks = take(global.kv_seg, 1, pos.k);
    inputs = AttentionInputs{q, k, v, bias, mask, global.sinks, qs, ks};  // take() keeps undefined ones undefined
  }
  Shard(const Shard&) = delete;  // `inputs` views the tensors

  TokenPositions pos;
  std::vector<int64_t> q_rows;
  Tensor q, k, v, bias, mask, qs, ks;
  AttentionInputs inputs;
};

// The ring tests' option sets: none, causal, window, segments, bias, mask, all, causal + sinks + soft cap, and a
// narrow window without and with causal (whole blocks skipped).
inline std::vector<Options> ring_option_sets() {
  std::vector<Options> opts(10);
  opts[1].causal = true;
  opts[2].window = true;
  opts[3].segments = true;
  opts[4].bias = true;
  opts[5].mask = true;
  opts[6] = Options{true, true, true, true, true, true, true, true};
  opts[7].causal = opts[7].sinks = opts[7].softcap = true;
  opts[8].narrow_window = true;  // whole blocks outside the window (attention/ring/ring_schedule.h)
  opts[9].causal = opts[9].narrow_window = true;
  return opts;
}

}  // namespace ra::test
