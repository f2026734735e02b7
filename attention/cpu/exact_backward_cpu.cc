#include "attention/cpu/exact_backward_cpu.h"

#include <algorithm>
#include <cmath>

#include "attention/attention_impl.h"
#include "attention/validate.h"
#include "runtime/error.h"

namespace ra {
namespace {

// A term below 2^e is counted in units of 2^(e - kTermBits): below 2^61, half kFixedTermLimit, which
// leaves room for the rounding of a probability just above 1.
constexpr int kTermBits = 61;

// The e with |x| <= 2^e (x = f * 2^e, f in [0.5, 1)).
int exponent_of(double x) {
  int e = 0;
  std::frexp(x, &e);
  return e;
}

double unit_for(int exponent) { return std::ldexp(1.0, kTermBits - exponent); }

void add_as_f32(const TensorView& acc, const Fixed* sums, int exponent) {
  RA_CHECK(acc.dtype() == DType::kF32 && acc.is_contiguous() && host_accessible(acc.memory()),
           "the deterministic backward adds into contiguous f32 host accumulators");
  float* out = acc.data_as<float>();
  for (int64_t i = 0; i < acc.numel(); ++i) out[i] += fixed_to_float(sums[i], exponent - kTermBits);
}

}  // namespace

MagnitudeBounds MagnitudeBounds::of(const AttentionInputs& in, const BackwardInputs& grad) {
  return {magnitude_exponent(in.q), magnitude_exponent(in.k), magnitude_exponent(in.v), magnitude_exponent(grad.d_o),
          magnitude_exponent(grad.delta)};
}

ExactBackward::ExactBackward(const AttentionInputs& in, const AttentionParams& params, const MagnitudeBounds& global,
                             bool with_dbias)
    : params_(params), batch_(in.k.dim(0)), kv_heads_(in.k.dim(2)), head_dim_(in.k.dim(3)), value_dim_(in.v.dim(3)) {
  // Bounds of every term (sdpa_backward_rows; validated params: dropout < 1): P <= 1, a kept probability is scaled by keep <= 2^keep_exp,
  // dP = dO . V over Dv, dS = P (dP keep - delta).
  const int keep_exp = exponent_of(1.0 / (1.0 - double(params.dropout_prob)));
  const int scale_exp = exponent_of(double(effective_scale(params, in.q.dim(3))));
  const int dp_exp = int(global.d_o + global.v) + exponent_of(double(value_dim_)) + keep_exp;
  const int ds_exp = std::max(dp_exp, int(global.delta)) + 1;
  dq_exp_ = ds_exp + scale_exp + int(global.k);  // dS scale (1 - tanh^2 <= 1) k
  dk_exp_ = ds_exp + scale_exp + int(global.q);
  dv_exp_ = keep_exp + int(global.d_o);  // P keep dO
  dbias_exp_ = ds_exp;
  dsinks_exp_ = int(global.delta);  // P_sink delta
  dq_.assign(size_t(in.q.numel()), 0);
  if (in.bias.defined() && with_dbias) dbias_.assign(size_t(in.bias.numel()), 0);
}

void ExactBackward::add_block(const AttentionInputs& block, const TokenPositions& pos, const BackwardInputs& grad,
                              Fixed* dk, Fixed* dv) {
  const FixedUnits units{unit_for(dq_exp_), unit_for(dk_exp_), unit_for(dv_exp_), unit_for(dbias_exp_)};
  const FixedGradViews views{dq_.data(), dk, dv, dbias_.empty() ? nullptr : dbias_.data(), units};
  RA_CHECK(sdpa_accumulate_backward_fixed(block, pos, params_, grad, views),
           "deterministic backward: a gradient term is not finite or exceeds the fixed-point range its input bounds "
           "give (a bias or sinks of NaN or +Inf?)");
}

std::vector<Fixed> ExactBackward::sinks_sums(const TensorView& sinks, const TensorView& lse,
                                             const TensorView& delta) const {
  const int64_t B = lse.dim(0), H = lse.dim(1), T = lse.dim(2);
  const Tensor s = f32_copy(sinks);
  const float *l = lse.data_as<float>(), *dl = delta.data_as<float>();
  const double unit = unit_for(dsinks_exp_);
  std::vector<Fixed> sums(size_t(H), 0);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t r = (b * H + h) * T + t;
        if (l[r] == -INFINITY) continue;
        const double p_sink = std::exp(std::fmin(double(s.data<float>()[h]) - double(l[r]), 0.0));  // <= 1
        RA_CHECK(fixed_add(sums[size_t(h)], -p_sink * double(dl[r]), unit),
                 "deterministic backward: a sink's gradient term exceeds its fixed-point range (is lse the "
                 "forward's?)");
      }
  return sums;
}

void ExactBackward::dq_into(const TensorView& acc) const { add_as_f32(acc, dq_.data(), dq_exp_); }
void ExactBackward::dk_into(const Fixed* dk, const TensorView& acc) const { add_as_f32(acc, dk, dk_exp_); }
void ExactBackward::dv_into(const Fixed* dv, const TensorView& acc) const { add_as_f32(acc, dv, dv_exp_); }
void ExactBackward::dbias_into(const TensorView& acc) const { add_as_f32(acc, dbias_.data(), dbias_exp_); }

Tensor ExactBackward::dsinks(const std::vector<Fixed>& sums) const {
  Tensor out(DType::kF32, {int64_t(sums.size())});
  for (size_t h = 0; h < sums.size(); ++h) out.data<float>()[h] = fixed_to_float(sums[h], dsinks_exp_ - kTermBits);
  return out;
}

}  // namespace ra
