// Blockwise attention: a scan over key chunks per query chunk, combining chunk carries with merge().
#include "attention/cpu/blockwise_cpu.h"

#include <algorithm>

#include "attention/cpu/sdpa_cpu.h"

namespace ra {

AttentionInputs slice_inputs(const AttentionInputs& in, int64_t q0, int64_t nq, int64_t k0, int64_t nk,
                             int64_t total_keys) {
  AttentionInputs out = in;
  const Shape full{in.q.dim(0), in.q.dim(2), in.q.dim(1), total_keys};
  out.q = narrow(in.q, 1, q0, nq);
  out.k = narrow(in.k, 1, k0, nk);
  out.v = narrow(in.v, 1, k0, nk);
  if (in.bias.defined()) out.bias = narrow(broadcast_to(in.bias, full, "bias"), 2, q0, nq);
  if (in.mask.defined()) out.mask = narrow(broadcast_to(in.mask, full, "mask"), 2, q0, nq);
  if (in.q_segment_ids.defined()) {
    out.q_segment_ids = narrow(in.q_segment_ids, 1, q0, nq);
    out.kv_segment_ids = narrow(in.kv_segment_ids, 1, k0, nk);
  }
  return out;
}

TokenPositions slice_positions(const TokenPositions& pos, int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
  TokenPositions out;
  out.q.assign(pos.q.begin() + q0, pos.q.begin() + q0 + nq);
  out.k.assign(pos.k.begin() + k0, pos.k.begin() + k0 + nk);
  out.total_keys = pos.total_keys;
  return out;
}

void blockwise_accumulate_cpu(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& p,
                              Carry& carry) {
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), S = in.k.dim(1), Dv = in.v.dim(3);
  for (int64_t q0 = 0; q0 < T; q0 += p.block_q) {
    const int64_t nq = std::min(p.block_q, T - q0);
    Carry chunk = Carry::empty(B, Hq, nq, Dv);
    for (int64_t k0 = 0; k0 < S; k0 += p.block_k) {
      const int64_t nk = std::min(p.block_k, S - k0);
      Carry step = Carry::empty(B, Hq, nq, Dv);
      sdpa_accumulate_cpu(slice_inputs(in, q0, nq, k0, nk, pos.total_keys), slice_positions(pos, q0, nq, k0, nk),
                          p, step);
      merge(chunk, step);
    }
    merge(carry, chunk, q0);
  }
}

}  // namespace ra
