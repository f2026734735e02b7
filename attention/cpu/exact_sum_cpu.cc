// Fixed-point sums of the exact-sum ring mode. Scaling by powers of two is exact, a product of two
// f32 values is exact in f64, and each term is rounded to an integer once, on its own.
#include "attention/cpu/exact_sum_cpu.h"

#include <atomic>
#include <cmath>
#include <limits>

#include "attention/attention_impl.h"
#include "attention/pair_logit.h"
#include "runtime/error.h"

namespace ra {
namespace {

// Terms in units of 2^-50 (of 1 for probabilities, of 2^e for values). A term is at most
// 1 / (1 - dropout) <= 2^12 units of 1, so it rounds to an int64 (below 2^62) in one instruction, and
// the int128 sums hold 2^65 such terms.
constexpr int kFractionBits = 50;
constexpr float kMaxDropout = 0.99975f;  // 1 / (1 - p) < 2^12

// Calls row(b, h, kh, t, q) for every query row, in parallel over (b, h).
template <typename Row>
void for_each_row(const F32Inputs& in, const Row& row) {
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), group = Hq / in.k.dim(2);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t t = 0; t < T; ++t)
        row(b, h, h / group, t, in.q.data_as<float>() + b * in.q.stride(0) + t * in.q.stride(1) + h * in.q.stride(2));
}

}  // namespace

ExactSum::ExactSum(int64_t batch, int64_t heads, int64_t rows, int64_t value_dim, int value_exponent)
    : batch_(batch), heads_(heads), rows_(rows), value_dim_(value_dim), value_exponent_(value_exponent),
      max_(size_t(batch * heads * rows), -INFINITY),
      numerator_(size_t(batch * heads * rows * value_dim), 0),
      denominator_(size_t(batch * heads * rows), 0) {}

void ExactSum::max_pass(const AttentionInputs& raw, const TokenPositions& pos, const AttentionParams& p) {
  const F32Inputs in = as_f32_inputs(raw, pos);
  const float scale = effective_scale(p, in.q.dim(3));
  for_each_row(in, [&](int64_t b, int64_t h, int64_t kh, int64_t t, const float* q) {
    float& m = max_[size_t((b * heads_ + h) * rows_ + t)];
    for (int64_t j = 0; j < in.k.dim(1); ++j) m = std::fmax(m, pair_logit<float>(in, pos, p, scale, q, b, h, kh, t, j));
  });
}

void ExactSum::sum_pass(const AttentionInputs& raw, const TokenPositions& pos, const AttentionParams& p) {
  const F32Inputs in = as_f32_inputs(raw, pos);
  const float scale = effective_scale(p, in.q.dim(3));
  RA_CHECK(p.dropout_prob <= kMaxDropout, "dropout ", p.dropout_prob, " is above ", kMaxDropout,
           ", the largest the deterministic ring's fixed-point sums hold");
  const float keep_scale = 1.0f / (1.0f - p.dropout_prob);
  const double probability_scale = std::ldexp(1.0, kFractionBits);
  const double value_scale = std::ldexp(1.0, kFractionBits - value_exponent_);
  std::atomic<bool> not_finite{false};  // a logit of NaN or +Inf (from the bias): no fixed-point term
  for_each_row(in, [&](int64_t b, int64_t h, int64_t kh, int64_t t, const float* q) {
    const int64_t r = (b * heads_ + h) * rows_ + t;
    const float m = max_[size_t(r)];
    if (m == -INFINITY) return;
    Fixed* num = &numerator_[size_t(r * value_dim_)];
    for (int64_t j = 0; j < in.k.dim(1); ++j) {
      const float s = pair_logit<float>(in, pos, p, scale, q, b, h, kh, t, j);
      if (s == -INFINITY) continue;
      const float e = std::exp(s - m);
      if (!(e <= 1.0f)) {
        not_finite.store(true, std::memory_order_relaxed);
        continue;
      }
      const float w = dropout_weight(p, keep_scale, e, b, h, pos.q[size_t(t)], pos.k[size_t(j)]);
      denominator_[size_t(r)] += to_fixed(e, probability_scale);
      if (w == 0.0f) continue;
      const float* v = in.v.data_as<float>() + b * in.v.stride(0) + j * in.v.stride(1) + kh * in.v.stride(2);
      for (int64_t d = 0; d < value_dim_; ++d) num[d] += to_fixed(double(w) * double(v[d]), value_scale);
    }
  });
  RA_CHECK(!not_finite.load(), "a logit is NaN or +Inf (a bias holding NaN or +Inf?): the deterministic ring's "
           "fixed-point sums cannot carry it (run without --deterministic to have it propagate)");
}

void ExactSum::merge_into(Carry& carry) const {
  RA_CHECK(carry.batch == batch_ && carry.heads == heads_ && carry.rows == rows_ && carry.value_dim == value_dim_,
           "exact-sum result and carry differ in shape");
  // As a carry: numerator = O (already divided), denominator = 1, max = LSE; finalize then gives O
  // and LSE unchanged (and adds sinks as for any carry).
  Carry result = Carry::empty(batch_, heads_, rows_, value_dim_);
  float* o = result.numerator.data<float>();
  float* den = result.denominator.data<float>();
  float* mx = result.max.data<float>();
  for (int64_t r = 0; r < batch_ * heads_ * rows_; ++r) {
    if (max_[size_t(r)] == -INFINITY || denominator_[size_t(r)] == 0) continue;
    const long double l = static_cast<long double>(denominator_[size_t(r)]);
    for (int64_t d = 0; d < value_dim_; ++d)
      o[r * value_dim_ + d] =
          float(std::ldexp(static_cast<long double>(numerator_[size_t(r * value_dim_ + d)]) / l,
                           value_exponent_));
    den[r] = 1.0f;
    mx[r] = float(double(max_[size_t(r)]) + std::log(std::ldexp(double(l), -kFractionBits)));
  }
  merge(carry, result);
}

}  // namespace ra
