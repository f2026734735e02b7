// Random problems and comparisons against the f64 reference.
#include "tests/support/problem.h"

#include "attention/validate.h"
#include "runtime/memory.h"
#include "runtime/random.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace ra::test {

std::vector<Options> option_sets() {
  std::vector<Options> sets(10);
  sets[1].causal = true;
  sets[2].window = true;
  sets[3].softcap = true;
  sets[4].sinks = true;
  sets[5].bias = true;
  sets[6].mask = true;
  sets[7].segments = true;
  sets[8].dropout = true;
  sets[9] = Options{true, true, true, true, true, true, true, true};
  return sets;
}

std::string Options::name() const {
  std::string n;
  auto add = [&](bool on, const char* s) {
    if (!on) return;
    if (!n.empty()) n += '_';
    n += s;
  };
  add(causal, "causal");
  add(window, "window");
  add(softcap, "softcap");
  add(sinks, "sinks");
  add(bias, "bias");
  add(mask, "mask");
  add(segments, "segments");
  add(dropout, "dropout");
  add(narrow_window, "narrow_window");
  add(mask_documents, "documents");
  return n.empty() ? "plain" : n;
}


Problem::Problem(const ProblemSpec& spec) : spec_(spec) {
  std::mt19937_64 rng(spec.seed);
  const int64_t B = spec.batch, T = spec.q_len, S = spec.kv_len, Hq = spec.q_heads, Hkv = spec.kv_heads;
  q = random_normal(spec.dtype, {B, T, Hq, spec.head_dim}, rng, 1.0f);
  k = random_normal(spec.dtype, {B, S, Hkv, spec.head_dim}, rng, 1.0f);
  v = random_normal(spec.dtype, {B, S, Hkv, spec.v_head_dim}, rng, 1.0f);
  const Options& o = spec.options;
  params_.causal = o.causal;
  if (o.window) {
    params_.window_left = 1 + int64_t(rng() % uint64_t(std::max<int64_t>(S / 3, 1)));
    params_.window_right = int64_t(rng() % 8);
  }
  if (o.narrow_window) {
    params_.window_left = int64_t(rng() % 4);
    params_.window_right = int64_t(rng() % 3);
  }
  if (o.softcap) params_.logits_soft_cap = 2.5f;
  if (o.dropout) {
    params_.dropout_prob = 0.2f;
    params_.dropout_seed = spec.seed * 7919;
  }
  if (o.sinks) {
    sinks = random_normal(DType::kF32, {Hq}, rng, 1.0f);
    // A sink of -inf is no sink (gpt-oss-style files give heads without one so): the last head's, beside finite ones.
    if (Hq > 1) sinks.data<float>()[Hq - 1] = -INFINITY;
  }
  if (o.bias) {  // broadcast over batch
    bias = random_normal(DType::kF32, {1, Hq, T, S}, rng, 1.0f);
    // -inf hides a pair, as PyTorch's float attn_mask writes it: about one pair in eight, and all of head 0's
    // row T / 3, which must come out as a fully masked row (O = 0, LSE = -inf or the sink, zero gradients).
    float* x = bias.data<float>();
    for (int64_t i = 0; i < bias.numel(); ++i)
      if (rng() % 8 == 0) x[i] = -INFINITY;
    std::fill(x + (T / 3) * S, x + (T / 3 + 1) * S, -INFINITY);
  }
  if (o.mask && !o.mask_documents) {
    mask = Tensor(DType::kU8, {B, 1, T, S});  // broadcast over heads
    uint8_t* m = mask.data<uint8_t>();
    for (int64_t i = 0; i < mask.numel(); ++i) m[i] = (rng() % 5) != 0;
    // One fully masked query row per batch: it must come out as O = 0, LSE = -inf (or the sink).
    for (int64_t b = 0; b < B; ++b) std::fill(m + (b * T + T / 2) * S, m + (b * T + T / 2 + 1) * S, uint8_t(0));
  }
  if (o.mask && o.mask_documents) {
    const int64_t mb = spec.seed % 3 == 0 ? 1 : B, mh = spec.seed % 3 == 1 ? Hq : 1;
    mask = Tensor(DType::kU8, {mb, mh, T, S});
    uint8_t* m = mask.data<uint8_t>();
    for (int64_t bh = 0; bh < mb * mh; ++bh) {
      std::vector<int64_t> starts{0};  // the documents' first keys
      while (starts.back() < S) starts.push_back(std::min<int64_t>(S, starts.back() + 1 + int64_t(rng() % 600)));
      std::vector<bool> holey(starts.size());
      for (size_t d = 0; d < holey.size(); ++d) holey[d] = rng() % 3 == 0;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t p = t + (S - T) > 0 ? t + (S - T) : t % S;  // the query's key position (as segment ids)
        const size_t d = size_t(std::upper_bound(starts.begin(), starts.end(), p) - starts.begin()) - 1;
        uint8_t* row = m + (bh * T + t) * S;
        for (int64_t j = starts[d]; j < starts[d + 1]; ++j) row[j] = !holey[d] || rng() % 16 != 0;
      }
      std::fill(m + (bh * T + T / 2) * S, m + (bh * T + T / 2 + 1) * S, uint8_t(0));  // a fully masked row
    }
  }
  if (o.segments) {  // packed sequences: sorted ids with random lengths, aligned to the end for T != S
    q_seg = Tensor(DType::kI32, {B, T});
    kv_seg = Tensor(DType::kI32, {B, S});
    for (int64_t b = 0; b < B; ++b) {
      const uint64_t longest = spec.segment_ids == SegmentIds::kFew ? uint64_t(S / 3 + 1)
                               : spec.segment_ids == SegmentIds::kPacked ? 96
                               : spec.segment_ids == SegmentIds::kLong   ? 400
                                                                         : 40;
      std::vector<int64_t> cu{0};
      while (cu.back() < S) cu.push_back(std::min<int64_t>(S, cu.back() + 1 + int64_t(rng() % longest)));
      std::vector<int32_t> ids = segment_ids_from_cu_seqlens(cu);
      if (spec.segment_ids == SegmentIds::kCycled)
        for (int32_t& id : ids) id %= 3;
      std::copy(ids.begin(), ids.end(), kv_seg.data<int32_t>() + b * S);
      for (int64_t t = 0; t < T; ++t) q_seg.data<int32_t>()[b * T + t] = ids[size_t(t + (S - T) > 0 ? t + (S - T) : t % S)];
    }
  }
}

AttentionInputs Problem::inputs() const {
  return AttentionInputs{q, k, v, bias, mask, sinks, q_seg, kv_seg};  // undefined tensors give undefined views
}

double max_abs_value(const TensorView& v) {
  double m = 0;
  for (int64_t i = 0; i < v.numel(); ++i) m = std::max(m, double(std::fabs(load_as_f32(v.data(), v.dtype(), size_t(i)))));
  return m;
}

std::vector<float> as_f32(const TensorView& t) {
  const Tensor host = to_memory(t, MemoryKind::kHost);
  const Tensor f32 = f32_copy(host.view());
  return std::vector<float>(f32.data<float>(), f32.data<float>() + f32.numel());
}


}  // namespace ra::test
