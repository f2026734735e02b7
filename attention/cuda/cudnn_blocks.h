// How the `cudnn` implementation cuts a call into cuDNN calls (host logic only, no cuDNN: tested without a GPU).
// Rows are cut into runs of consecutive positions (a zigzag shard is two runs); each (query run, key run) pair is
// skipped, computed without a mask, or with cuDNN's causal mask where its diagonal is one cuDNN can express
// (top-left or bottom-right aligned; other diagonals are cut into parts that are). Pairs may first be cut into
// chunks of at most so many query and key rows, bounding what one call's outputs and workspace take.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/params.h"

namespace ra {

enum class CudnnMask : int { kNone, kCausalTopLeft, kCausalBottomRight };

struct PositionRun {
  int64_t index, length, first_position;  // rows [index, index + length) hold positions first_position + i
};

struct CudnnBlock {
  PositionRun q, k;
  CudnnMask mask;
};

std::vector<PositionRun> consecutive_runs(const int64_t* positions, int64_t count);

// The cuDNN calls of every (query run, key run) pair, each pair first cut into as few chunks of near-equal
// rows as keep at most max_q_rows query rows and max_k_rows key rows (0: no limit) in a call. Causal masks
// only (windows are refused before).
std::vector<CudnnBlock> cudnn_blocks(const std::vector<PositionRun>& q_runs, const std::vector<PositionRun>& k_runs,
                                     const AttentionParams& p, int64_t max_q_rows = 0, int64_t max_k_rows = 0);

// Where a caller lets the calls write its dK / dV rows instead of adding to them (GradViews::kv_unset): each
// call's key rows cut into spans it is the first to cover (written) and spans an earlier call covered (added),
// and the rows no call covers (zeroed). Spans count key rows of the call's view (index as in PositionRun).
struct RowSpan {
  int64_t index, length;
  bool first;  // no earlier call covers these rows
};
struct KeyRowWrites {
  std::vector<std::vector<RowSpan>> per_block;  // per block of the list, in order, its key rows in order
  std::vector<RowSpan> uncovered;               // rows of [0, rows) no block covers
};
KeyRowWrites key_row_writes(const std::vector<CudnnBlock>& blocks, int64_t rows);

}  // namespace ra
