// The ring's schedule: index runs from the layout, expanded once; blocks classified per pair of runs.
#include "attention/ring/ring_schedule.h"

#include <algorithm>
#include <optional>

#include "attention/inputs.h"
#include "runtime/error.h"

namespace ra {
namespace {

// The offsets k - q the causal mask and the window let through: [lo, hi], a side absent when unbounded.
struct VisibleOffsets {
  std::optional<int64_t> lo, hi;
  explicit VisibleOffsets(const AttentionParams& p) {
    if (p.window_left >= 0) lo = -p.window_left;
    if (p.causal) hi = 0;
    if (p.window_right >= 0) hi = hi ? std::min(*hi, p.window_right) : p.window_right;
  }
};

// The offsets base + m * step for m in [m_lo, m_hi] (step > 0) against the visible ones.
BlockKind classify_progression(__int128 base, __int128 step, __int128 m_lo, __int128 m_hi, const VisibleOffsets& v) {
  const __int128 least = base + m_lo * step, most = base + m_hi * step;
  if (v.hi && least > *v.hi) return BlockKind::kSkip;
  if (v.lo && most < *v.lo) return BlockKind::kSkip;
  // The first offset at or above lo must still be at or below hi.
  __int128 m = m_lo;
  if (v.lo && least < *v.lo) m = m_lo + (*v.lo - least + step - 1) / step;
  if (m > m_hi || (v.hi && base + m * step > *v.hi)) return BlockKind::kSkip;
  const bool full = (!v.lo || least >= *v.lo) && (!v.hi || most <= *v.hi);
  return full ? BlockKind::kFull : BlockKind::kPartial;
}

// Rows [first, first + count) of `runs` (local row order), as runs.
std::vector<IndexRun> slice_runs(const std::vector<IndexRun>& runs, int64_t first, int64_t count) {
  std::vector<IndexRun> out;
  for (const IndexRun& run : runs) {
    if (count <= 0) break;
    if (first >= run.count) {
      first -= run.count;
      continue;
    }
    const int64_t take = std::min(run.count - first, count);
    out.push_back({run.start + first * run.stride, take, run.stride});
    count -= take;
    first = 0;
  }
  return out;
}

}  // namespace

std::vector<int64_t> layout_query_positions(SequenceLayout layout, int64_t q_len, int64_t kv_len, int parts, int index) {
  std::vector<int64_t> positions = layout_indices(layout, q_len, parts, index);
  for (int64_t& p : positions) p += kv_len - q_len;
  return positions;
}

BlockKind classify_runs(const IndexRun& q, const IndexRun& k, const AttentionParams& params) {
  const VisibleOffsets visible(params);
  if (q.count <= 0 || k.count <= 0) return BlockKind::kSkip;
  if (!visible.lo && !visible.hi) return BlockKind::kFull;
  // Offsets k - q = (k.start - q.start) + j * k.stride - i * q.stride over i < q.count, j < k.count.
  const __int128 base = __int128(k.start) - q.start, u = q.stride, t = k.stride;
  if (q.count == 1 && t > 0) return classify_progression(base, t, 0, k.count - 1, visible);
  if (k.count == 1 && u > 0) return classify_progression(base - (q.count - 1) * u, u, 0, q.count - 1, visible);
  if (u == t && u > 0) return classify_progression(base, u, -(q.count - 1), k.count - 1, visible);
  // Runs of different strides: every offset between the least and the most taken as possible.
  return classify_progression(base - (q.count - 1) * u, 1, 0, (k.count - 1) * t + (q.count - 1) * u, visible);
}

RingSchedule::RingSchedule(SequenceLayout layout, int64_t q_len, int64_t kv_len, int ranks, int rank)
    : ranks_(ranks), rank_(rank) {
  RA_CHECK(ranks > 0 && rank >= 0 && rank < ranks, "ring schedule: rank ", rank, " of ", ranks);
  query_runs_ = layout_runs(layout, q_len, ranks, rank);
  for (IndexRun& run : query_runs_) run.start += kv_len - q_len;
  query_positions_ = layout_query_positions(layout, q_len, kv_len, ranks, rank);
  for (int r = 0; r < ranks; ++r) {
    key_offsets_.push_back(r == 0 ? 0 : key_offsets_.back() + int64_t(keys_.back().size()));
    key_runs_.push_back(layout_runs(layout, kv_len, ranks, r));
    keys_.push_back(layout_indices(layout, kv_len, ranks, r));
    keys_pair_up_.push_back(dropout_keys_pair_up(keys_.back()));
    slot_rows_ = std::max(slot_rows_, int64_t(keys_.back().size()));
    keys_sorted_ = keys_sorted_ && std::is_sorted(keys_.back().begin(), keys_.back().end());
  }
}

std::vector<int64_t> RingSchedule::rows_of_each_rank() const {
  std::vector<int64_t> rows;
  for (const std::vector<int64_t>& k : keys_) rows.push_back(int64_t(k.size()));
  return rows;
}

std::vector<int64_t> RingSchedule::all_keys() const {
  std::vector<int64_t> all;
  all.reserve(size_t(key_offsets_.back() + int64_t(keys_.back().size())));
  for (const std::vector<int64_t>& k : keys_) all.insert(all.end(), k.begin(), k.end());
  return all;
}

BlockKind RingSchedule::kind(int source, const AttentionParams& params, int64_t first, int64_t count) const {
  const std::vector<IndexRun>& runs = key_runs_[size_t(source)];
  const std::vector<IndexRun> key_runs = slice_runs(runs, first, count < 0 ? rows(source) - first : count);
  bool any_visible = false, all_full = true;
  for (const IndexRun& q : query_runs_)
    for (const IndexRun& k : key_runs) {
      const BlockKind pair = classify_runs(q, k, params);
      any_visible = any_visible || pair != BlockKind::kSkip;
      all_full = all_full && pair == BlockKind::kFull;
    }
  if (!any_visible) return BlockKind::kSkip;
  return all_full ? BlockKind::kFull : BlockKind::kPartial;
}

}  // namespace ra
