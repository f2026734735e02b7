#include "attention/cuda/cudnn_blocks.h"

#include <algorithm>

#include "attention/block_kind.h"

namespace ra {
namespace {

PositionRun head(const PositionRun& r, int64_t n) { return {r.index, std::min(n, r.length), r.first_position}; }
PositionRun tail(const PositionRun& r, int64_t n) {
  const int64_t drop = std::min(n, r.length);
  return {r.index + drop, r.length - drop, r.first_position + drop};
}

// The parts of one pair with a mask cuDNN can express. A causal diagonal it cannot (the ring's half blocks:
// queries that start before the keys, or keys that start before the queries on a block that is not
// bottom-right aligned) is cut into what it can: queries before the first key see none of it and drop out,
// keys before the first query are seen by every query (one unmasked part), and what is left has its diagonal
// at the top left.
void add_expressible_parts(PositionRun qr, PositionRun kr, const AttentionParams& p, std::vector<CudnnBlock>& out) {
  const BlockKind kind = classify_block(qr.first_position, qr.first_position + qr.length - 1, kr.first_position,
                                        kr.first_position + kr.length - 1, p.causal, p.window_left, p.window_right);
  if (kind == BlockKind::kSkip) return;
  if (kind == BlockKind::kFull) return out.push_back({qr, kr, CudnnMask::kNone});
  // Key k_lo + j is visible from query q_lo + i when j <= i + (q_lo - k_lo).
  const int64_t offset = qr.first_position - kr.first_position;
  if (offset == 0) return out.push_back({qr, kr, CudnnMask::kCausalTopLeft});
  if (offset > 0 && offset == kr.length - qr.length) return out.push_back({qr, kr, CudnnMask::kCausalBottomRight});
  if (offset < 0) return add_expressible_parts(tail(qr, -offset), kr, p, out);
  out.push_back({qr, head(kr, offset), CudnnMask::kNone});
  add_expressible_parts(qr, tail(kr, offset), p, out);
}

// r as the fewest chunks of at most max_rows rows (0: r whole), their lengths differing by one at most.
std::vector<PositionRun> chunks(const PositionRun& r, int64_t max_rows) {
  const int64_t count = max_rows > 0 ? std::max<int64_t>(1, (r.length + max_rows - 1) / max_rows) : 1;
  std::vector<PositionRun> out;
  for (int64_t i = 0, start = 0; i < count; ++i) {
    const int64_t length = r.length / count + (i < r.length % count ? 1 : 0);
    out.push_back({r.index + start, length, r.first_position + start});
    start += length;
  }
  return out;
}

}  // namespace

std::vector<PositionRun> consecutive_runs(const int64_t* positions, int64_t count) {
  std::vector<PositionRun> runs;
  for (int64_t i = 0; i < count; ++i) {
    if (!runs.empty() && positions[i] == runs.back().first_position + runs.back().length) ++runs.back().length;
    else runs.push_back({i, 1, positions[i]});
  }
  return runs;
}

std::vector<CudnnBlock> cudnn_blocks(const std::vector<PositionRun>& q_runs, const std::vector<PositionRun>& k_runs,
                                     const AttentionParams& p, int64_t max_q_rows, int64_t max_k_rows) {
  std::vector<CudnnBlock> out;
  for (const PositionRun& qr : q_runs)
    for (const PositionRun& kr : k_runs)
      for (const PositionRun& q : chunks(qr, max_q_rows))
        for (const PositionRun& k : chunks(kr, max_k_rows)) add_expressible_parts(q, k, p, out);
  return out;
}

KeyRowWrites key_row_writes(const std::vector<CudnnBlock>& blocks, int64_t rows) {
  KeyRowWrites out;
  std::vector<std::pair<int64_t, int64_t>> covered;  // [begin, end), sorted and disjoint
  for (const CudnnBlock& b : blocks) {
    std::vector<RowSpan> spans;
    const int64_t begin = b.k.index, end = b.k.index + b.k.length;
    int64_t at = begin;
    for (const auto& [c0, c1] : covered) {
      if (c1 <= at || c0 >= end) continue;
      if (c0 > at) spans.push_back({at, c0 - at, true});
      const int64_t stop = std::min(c1, end);
      spans.push_back({std::max(c0, at), stop - std::max(c0, at), false});
      at = stop;
    }
    if (at < end) spans.push_back({at, end - at, true});
    out.per_block.push_back(std::move(spans));
    covered.emplace_back(begin, end);
    std::sort(covered.begin(), covered.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& c : covered) {
      if (merged.empty() || c.first > merged.back().second) merged.push_back(c);
      else merged.back().second = std::max(merged.back().second, c.second);
    }
    covered = std::move(merged);
  }
  int64_t at = 0;
  for (const auto& [c0, c1] : covered) {
    if (c0 > at) out.uncovered.push_back({at, c0 - at, true});
    at = std::max(at, c1);
  }
  if (at < rows) out.uncovered.push_back({at, rows - at, true});
  return out;
}

}  // namespace ra
