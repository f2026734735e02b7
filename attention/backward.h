// The backward pass's contract, the mirror of `accumulate`. For the query rows of a call (or of a ring
// rank) and one K/V block:
//   dQ (B, T, Hq, D)   += this block's part, into an f32 accumulator the caller holds;
//   dK (B, S, Hkv, D)  += this block's dK, f32 (summed over the query heads of a GQA group);
//   dV (B, S, Hkv, Dv) += this block's dV, f32;
//   dBias               += this block's columns, f32, reduced to the bias's broadcast shape.
// The probabilities are recomputed from the forward's final LSE (never stored T x S); delta =
// rowsum(dO * O) is computed once per call (FlashAttention's preprocess) and reused for every block.
// The sinks' gradient needs only LSE and delta: sinks_gradient_into, once per call.
#pragma once

#include <initializer_list>

#include "attention/inputs.h"
#include "runtime/tensor.h"

namespace ra {

struct AttentionParams;

struct BackwardInputs {
  TensorView lse;    // (B, Hq, T) f32: the forward's final LSE of these rows, natural log (-inf: no key seen)
  TensorView d_o;    // (B, T, Hq, Dv): the loss's gradient with respect to O, q's dtype or f32
  TensorView delta;  // (B, Hq, T) f32: rowsum(dO * O) - dLSE, from compute_delta
  TensorView o;      // (B, T, Hq, Dv): the forward's final O (cudnn computes its own delta from it)
  // Optional (B, Hq, T) f32: the loss's gradient with respect to LSE, where the loss reads LSE too (as
  // merging partial attention outputs by their LSE does). d LSE_i / d S_ij = P_ij, so it enters every dS
  // as dS_ij = P_ij (dP_ij - delta_i + dLSE_i): compute_delta folds it into delta, once per call.
  TensorView d_lse;
};

// Where accumulate_backward adds: contiguous f32 views shaped as q (dq), k (dk), v (dv) and the bias
// (dbias; undefined without a bias, or where its gradient is not wanted: the bias's sums are skipped). The
// caller owns them: the ring carries dk / dv between ranks.
//
// As backward()'s `into`: where it writes (dq, dk, dv in q's dtype or f32; dbias in the bias's shape and
// dsinks (Hq), both f32: undefined, returned instead), and which gradients of the bias and sinks it forms at all
// (false: none, neither written nor returned; a bias that takes no gradient, such as an attention mask given
// as a bias, skips the dbias sums and may take a kernel's direct path).
struct GradViews {
  TensorView dq, dk, dv, dbias;
  TensorView dsinks;
  bool bias_gradient = true, sinks_gradient = true;
  // dk and dv hold nothing the caller keeps (zeros, or anything): an implementation that honours it
  // (CudaAttentionImpl::writes_unset_kv) writes each of their rows (zero where no query sees its key) rather
  // than adding to them; the others add as always, so only zeroed views may carry it to those.
  bool kv_unset = false;
};

// Whether backward() forms the bias's / the sinks' gradient: the call has that parameter and `into` (where
// given) asks for it.
bool bias_gradient_wanted(const AttentionInputs& in, const GradViews* into);
bool sinks_gradient_wanted(const AttentionInputs& in, const GradViews* into);

// Owned f32 accumulators, zeroed, in `memory`, for the inputs `in`.
struct GradAccumulators {
  Tensor dq, dk, dv, dbias;
  static GradAccumulators zeros(const AttentionInputs& in, MemoryKind memory, bool with_dbias = true);
  // dq, dk and dv for the span of one call on `cuda_stream` (Tensor::temporary); no dbias (the single-call
  // backward makes its own where the gradient is asked for).
  static GradAccumulators temporary(const AttentionInputs& in, MemoryKind memory, void* cuda_stream);
  GradViews views() const { return {dq.view(), dk.view(), dv.view(), dbias.view()}; }
};

// What backward() returns: dq, dk, dv in the input dtype (f32 on request), dbias and dsinks in f32
// (undefined when there is no bias / no sinks).
struct Gradients {
  Tensor dq, dk, dv, dbias, dsinks;
};

// delta (B, Hq, T) f32 = sum over Dv of dO * O, row by row (f32 products and sums), minus d_lse where
// defined. On the device when o is (then on `cuda_stream`, a temporary of the call: Tensor::temporary). `zero`,
// where given (f32 (B, T, Hq, D), contiguous, D a multiple of 4, in o's memory: a dQ accumulator), is set to zeros
// too, on the device in delta's own pass (compute_delta_cuda).
Tensor compute_delta(const TensorView& o, const TensorView& d_o, const TensorView& d_lse, void* cuda_stream = nullptr,
                     const TensorView& zero = TensorView());

// dsinks (Hq, contiguous f32, written over) = -sum over (b, t) of exp(sink_h - lse) * delta: a sink is one
// more logit whose value row is zero, so its dS is P_sink * (0 - delta). Rows with lse = -inf contribute nothing.
void sinks_gradient_into(const TensorView& sinks, const TensorView& lse, const TensorView& delta,
                         const TensorView& dsinks, void* cuda_stream = nullptr);

// out (any float dtype, contiguous) <- the f32 accumulator `acc` (same shape), on acc's memory.
void convert_gradient(const TensorView& acc, const TensorView& out, void* cuda_stream = nullptr);
// A gradient in `dtype` from its f32 accumulator (the accumulator itself for f32), on acc's memory.
Tensor gradient_in_dtype(Tensor acc, DType dtype, void* cuda_stream = nullptr);

// Checks a caller-given output: `shape`, contiguous, in q's memory, f32 or (with q_dtype_or_f32) q's dtype.
void check_output(const TensorView& out, const char* name, const Shape& shape, const TensorView& q,
                  bool q_dtype_or_f32);

// A dbias (the bias's shape, or a view of a larger accumulator) as the kernels index it, over every (batch, query
// head, query, key) pair of the call: (B, Hq, T, total_keys), stride 0 where the bias broadcasts. Undefined for an
// undefined dbias (no gradient wanted).
TensorView dbias_over_pairs(const TensorView& dbias, const AttentionInputs& in, int64_t total_keys);

// Under params.deterministic: refuses a dbias (from dbias_over_pairs) with a broadcast dimension, whose sums the
// cuda kernels add by atomics across blocks in no fixed order (each pair of a full bias has one writer). The host
// kernels give each shared element to one thread, its sharers in order, so they take any bias.
void check_dbias_deterministic(const TensorView& dbias_pairs, const AttentionParams& params);

// A view and its name in messages.
struct NamedView {
  TensorView view;
  const char* name;
};
// Refuses an output that shares memory with one of `reads` (what the call reads) or with another output: the
// implementations write their outputs in pieces while they still read, so the result would depend on which ran.
// `reads` ends with the call's inputs (q, k, v, bias, mask, sinks and segment ids), added here.
void check_outputs_apart(std::initializer_list<NamedView> outputs, const AttentionInputs& in,
                         std::initializer_list<NamedView> reads = {});

// Checks dO, LSE (when need_lse), delta, dLSE and O (when given) against validated inputs, naming the
// tensor and the dimension.
void validate_backward(const AttentionInputs& in, const TensorView& o, const BackwardInputs& grad,
                       bool need_lse = true);

}  // namespace ra
