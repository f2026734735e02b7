// Blockwise attention: a scan over key chunks per query chunk, combining chunk carries with merge().
#include "attention/cpu/blockwise_cpu.h"

#include <algorithm>

#include "attention/validate.h"
#include "runtime/memory.h"

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

namespace {

// A contiguous copy of rows [t0, t0 + n) of a (B, H, T) f32 tensor.
Tensor row_chunk(const TensorView& rows, int64_t t0, int64_t n) {
  const int64_t BH = rows.dim(0) * rows.dim(1), T = rows.dim(2);
  Tensor out(DType::kF32, {rows.dim(0), rows.dim(1), n});
  for (int64_t bh = 0; bh < BH; ++bh)
    std::copy_n(rows.data_as<float>() + bh * T + t0, n, out.data<float>() + bh * n);
  return out;
}

// into (B, L, H, W) rows [l0, l0 + n) += chunk (B, n, H, W), both contiguous f32.
void add_rows(const TensorView& into, const Tensor& chunk, int64_t l0) {
  const int64_t B = into.dim(0), L = into.dim(1), n = chunk.shape()[1], width = into.dim(2) * into.dim(3);
  for (int64_t b = 0; b < B; ++b) {
    float* dst = into.data_as<float>() + (b * L + l0) * width;
    const float* src = chunk.data<float>() + b * n * width;
    for (int64_t i = 0; i < n * width; ++i) dst[i] += src[i];
  }
}

}  // namespace

void blockwise_accumulate_backward_cpu(const AttentionInputs& in, const TokenPositions& pos,
                                       const AttentionParams& p, const BackwardInputs& grad, const GradViews& acc) {
  const int64_t T = in.q.dim(1), S = in.k.dim(1);
  const TensorView dbias_pairs = dbias_over_pairs(acc.dbias, in, pos.total_keys);
  for (int64_t q0 = 0; q0 < T; q0 += p.block_q) {
    const int64_t nq = std::min(p.block_q, T - q0);
    const Tensor lse = row_chunk(grad.lse, q0, nq), delta = row_chunk(grad.delta, q0, nq);
    const BackwardInputs chunk_grad{lse, narrow(grad.d_o, 1, q0, nq), delta};
    const TensorView dbias = dbias_pairs.defined() ? narrow(dbias_pairs, 2, q0, nq) : TensorView();
    Tensor dq(DType::kF32, {in.q.dim(0), nq, in.q.dim(2), in.q.dim(3)});
    for (int64_t k0 = 0; k0 < S; k0 += p.block_k) {
      const int64_t nk = std::min(p.block_k, S - k0);
      const AttentionInputs chunk = slice_inputs(in, q0, nq, k0, nk, pos.total_keys);
      Tensor dk(DType::kF32, chunk.k.shape()), dv(DType::kF32, chunk.v.shape());
      sdpa_accumulate_backward_cpu(chunk, slice_positions(pos, q0, nq, k0, nk), p, chunk_grad,
                                   GradViews{dq, dk, dv, dbias});
      add_rows(acc.dk, dk, k0);
      add_rows(acc.dv, dv, k0);
    }
    add_rows(acc.dq, dq, q0);
  }
}

}  // namespace ra
