// The deterministic ring's backward: bitwise-identical gradients for any ring size and layout. The
// terms are sdpa's backward terms (attention/cpu/sdpa_backward_cpu.cc) in f64, each rounded on its own to
// a fixed-point unit and added into int128 sums (attention/cpu/fixed_point.h). Each sum's unit comes from
// bounds of the inputs over the whole sequence, the same on every rank, so a term rounds alike on
// whichever rank and in whichever block it is computed.
#pragma once

#include <vector>

#include "attention/backward.h"
#include "attention/cpu/fixed_point.h"
#include "attention/inputs.h"
#include "attention/params.h"

namespace ra {

// What each output's terms are multiplied by before rounding (powers of two).
struct FixedUnits {
  double dq = 1, dk = 1, dv = 1, dbias = 1;
};

// Fixed-point sums shaped as q (dq), k (dk), v (dv) and the bias (dbias; nullptr without one), contiguous.
struct FixedGradViews {
  Fixed *dq, *dk, *dv, *dbias;
  FixedUnits units;
};

// sdpa's backward terms into fixed-point sums (defined beside sdpa's backward, whose terms these are).
// False when a term exceeded its unit's range: the bounds did not hold (an LSE that is not this forward's).
bool sdpa_accumulate_backward_fixed(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                                    const BackwardInputs& grad, const FixedGradViews& acc);

// Exponents e with |x| < 2^e over this rank's q, k, v, dO and delta (int64: the ring takes their maximum).
struct MagnitudeBounds {
  int64_t q, k, v, d_o, delta;
  static MagnitudeBounds of(const AttentionInputs& in, const BackwardInputs& grad);
};

class ExactBackward {
 public:
  // `global`: the bounds over the whole sequence (every rank's maximum). `with_dbias`: the bias's sums are
  // formed (else dbias_sums() is empty).
  ExactBackward(const AttentionInputs& in, const AttentionParams& params, const MagnitudeBounds& global,
                bool with_dbias);

  // Elements of a block's dK and dV sums of `rows` rows: (B, rows, Hkv, D), then (B, rows, Hkv, Dv).
  size_t dk_count(int64_t rows) const { return size_t(batch_ * rows * kv_heads_ * head_dim_); }
  size_t dv_count(int64_t rows) const { return size_t(batch_ * rows * kv_heads_ * value_dim_); }

  // One K/V block: dQ and dBias into this rank's sums, the block's dK / dV added at dk / dv.
  void add_block(const AttentionInputs& block, const TokenPositions& pos, const BackwardInputs& grad, Fixed* dk,
                 Fixed* dv);
  // This rank's dsinks sums (Hq): -exp(sink - lse) * delta over its rows.
  std::vector<Fixed> sinks_sums(const TensorView& sinks, const TensorView& lse, const TensorView& delta) const;
  std::vector<Fixed>& dbias_sums() { return dbias_; }

  // acc (contiguous f32) += the sums, rounded to f32.
  void dq_into(const TensorView& acc) const;
  void dk_into(const Fixed* dk, const TensorView& acc) const;
  void dv_into(const Fixed* dv, const TensorView& acc) const;
  void dbias_into(const TensorView& acc) const;
  Tensor dsinks(const std::vector<Fixed>& sums) const;  // (Hq) f32

 private:
  AttentionParams params_;
  int64_t batch_, kv_heads_, head_dim_, value_dim_;
  // Each output's terms are below 2^exponent; its unit is 2^(kTermBits - exponent).
  int dq_exp_, dk_exp_, dv_exp_, dbias_exp_, dsinks_exp_;
  std::vector<Fixed> dq_, dbias_;
};

}  // namespace ra
