// Input and output sanity checks.
#include "attention/invariants.h"

#include <cmath>
#include <vector>

#include "attention/tolerance.h"
#include "runtime/error.h"

namespace ra {
namespace {

// Element i of a contiguous host tensor as f32.
float element(const TensorView& t, int64_t i) { return load_as_f32(t.data(), t.dtype(), size_t(i)); }

}  // namespace

int64_t count_nonfinite(const TensorView& t, bool minus_infinity_hides) {
  if (!t.defined()) return 0;
  const DType d = t.dtype();
  if (d != DType::kF32 && d != DType::kF16 && d != DType::kBF16 && d != DType::kF64) return 0;
  RA_CHECK(host_accessible(t.memory()) && t.is_contiguous(), "count_nonfinite needs a contiguous host tensor");
  int64_t bad = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = element(t, i);
    bad += !std::isfinite(x) && !(minus_infinity_hides && x == -INFINITY);
  }
  return bad;
}

void check_output_invariants(const AttentionInputs& in, const AttentionParams& params, const TensorView& o,
                             const TensorView& lse, Communicator& sequence_axis) {
  const int64_t B = in.v.dim(0), S = in.v.dim(1), Hkv = in.v.dim(2), Dv = in.v.dim(3);
  const int64_t T = o.dim(1), Hq = o.dim(2), group = Hq / Hkv;
  RA_CHECK(in.v.is_contiguous() && o.is_contiguous() && lse.is_contiguous(), "output checks need contiguous tensors");
  // V's range per (b, kv head, feature) over every key of the sequence; the max is kept negated so
  // that one all-reduce (min) gives both.
  std::vector<double> range(size_t(2 * B * Hkv * Dv), INFINITY);
  double max_abs_v = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t d = 0; d < Dv; ++d) {
          const double x = element(in.v, ((b * S + s) * Hkv + h) * Dv + d);
          const size_t i = size_t((b * Hkv + h) * Dv + d);
          range[2 * i] = std::fmin(range[2 * i], x);
          range[2 * i + 1] = std::fmin(range[2 * i + 1], -x);
          max_abs_v = std::fmax(max_abs_v, std::fabs(x));
        }
  sequence_axis.all_reduce(range.data(), range.size(), ReduceOp::kMin);
  sequence_axis.all_reduce(&max_abs_v, 1, ReduceOp::kMax);
  for (int64_t i = 0; i < lse.numel(); ++i) {
    const float x = lse.data_as<float>()[i];
    RA_CHECK(!std::isnan(x) && x != INFINITY, "output check: lse element ", i, " is ", x,
             " (expected finite, or -inf for a row that sees no key); nothing was written");
  }
  if (params.dropout_prob > 0) return;
  const double tol = output_tolerance(o.dtype(), max_abs_v);
  const bool sinks = in.sinks.defined();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < Dv; ++d) {
          const double x = element(o, ((b * T + t) * Hq + h) * Dv + d);
          const size_t i = size_t((b * Hkv + h / group) * Dv + d);
          double lo = range[2 * i], hi = -range[2 * i + 1];
          if (sinks || lse.data_as<float>()[(b * Hq + h) * T + t] == -INFINITY) lo = std::fmin(lo, 0.0), hi = std::fmax(hi, 0.0);
          RA_CHECK(x >= lo - tol && x <= hi + tol, "output check: o[", b, ", ", t, ", ", h, ", ", d, "] = ", x,
                   " lies outside [", lo, ", ", hi, "], the range of v's feature ", d,
                   " over all keys, which softmax weights cannot produce; nothing was written");
        }
}

}  // namespace ra
