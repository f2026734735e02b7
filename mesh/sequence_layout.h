// Sequence layouts: which global tokens a rank holds along the sequence axis, for any length L and
// any number of ranks N (no padding asked of the user):
//   contiguous: rank r holds chunk r of N
//   zigzag:     2N chunks, rank r holds chunks r and 2N-1-r (equal causal work on every rank)
//   striped:    token t on rank t mod N
// Chunk i of P is [floor(i L / P), floor((i + 1) L / P)): chunks differ by at most one token, and a
// rank may hold none (L < N). On one rank every layout is the identity. A layout maps local rows to
// global token indices, so masks and windows stay exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ra {

enum class SequenceLayout : uint8_t { kContiguous, kZigzag, kStriped };

SequenceLayout parse_layout(const std::string& name);
const char* layout_name(SequenceLayout layout);

// A run of global indices: start, start + stride, ..., count of them.
struct IndexRun {
  int64_t start, count, stride;
};

// The runs of global indices that part `index` of `parts` holds, in local order (empty runs left out).
std::vector<IndexRun> layout_runs(SequenceLayout layout, int64_t length, int parts, int index);
// The same, expanded: local row -> global index.
std::vector<int64_t> layout_indices(SequenceLayout layout, int64_t length, int parts, int index);
// How many rows part `index` holds, and the most any part holds.
int64_t layout_rows(SequenceLayout layout, int64_t length, int parts, int index);
int64_t layout_max_rows(SequenceLayout layout, int64_t length, int parts);

}  // namespace ra
