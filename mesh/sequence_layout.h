// Sequence layouts: which global tokens a rank holds along the sequence axis.
//   contiguous: rank r holds [r L/N, (r + 1) L/N)
//   zigzag:     2N chunks, rank r holds chunks r and 2N-1-r (equal causal work on every rank)
//   striped:    token t on rank t mod N
// A layout maps local rows to global token indices, so masks and windows stay exact.
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

// Throws unless `length` divides as the layout needs (N, or 2N for zigzag), naming `what`.
void check_layout_divides(SequenceLayout layout, int64_t length, int parts, const char* what);
// The runs of global indices that part `index` of `parts` holds, in local order.
std::vector<IndexRun> layout_runs(SequenceLayout layout, int64_t length, int parts, int index);
// The same, expanded: local row -> global index.
std::vector<int64_t> layout_indices(SequenceLayout layout, int64_t length, int parts, int index);

}  // namespace ra
