// Sequence layouts as runs of global indices.
#include "mesh/sequence_layout.h"

#include <algorithm>

#include "runtime/error.h"

namespace ra {

SequenceLayout parse_layout(const std::string& name) {
  if (name == "contiguous") return SequenceLayout::kContiguous;
  if (name == "zigzag") return SequenceLayout::kZigzag;
  if (name == "striped") return SequenceLayout::kStriped;
  RA_FAIL("layout '", name, "' is unknown: expected contiguous, zigzag or striped");
}

const char* layout_name(SequenceLayout layout) {
  switch (layout) {
    case SequenceLayout::kContiguous: return "contiguous";
    case SequenceLayout::kZigzag: return "zigzag";
    case SequenceLayout::kStriped: return "striped";
  }
  return "?";
}

namespace {

// Chunk i of `pieces` over `length`: floor division keeps sizes within one of each other. In 128 bits:
// i * length overflows 64 for lengths a corrupt file can declare (the fuzzer found 3 * 4.4e18).
IndexRun chunk(int64_t length, int64_t pieces, int64_t i) {
  const auto at = [&](int64_t j) { return int64_t(__int128(j) * length / pieces); };
  const int64_t begin = at(i), end = at(i + 1);
  return {begin, end - begin, 1};
}

}  // namespace

std::vector<IndexRun> layout_runs(SequenceLayout layout, int64_t length, int parts, int index) {
  RA_CHECK(length >= 0 && parts > 0 && index >= 0 && index < parts, "layout_runs: part ", index, " of ", parts,
           " over length ", length);
  std::vector<IndexRun> runs;
  switch (layout) {
    case SequenceLayout::kContiguous: runs = {chunk(length, parts, index)}; break;
    case SequenceLayout::kZigzag: {
      const int64_t pieces = 2 * int64_t(parts);
      runs = {chunk(length, pieces, index), chunk(length, pieces, pieces - 1 - index)};
      break;
    }
    case SequenceLayout::kStriped: runs = {{index, length > index ? (length - 1 - index) / parts + 1 : 0, parts}}; break;
  }
  std::erase_if(runs, [](const IndexRun& r) { return r.count == 0; });
  return runs;
}

int64_t layout_rows(SequenceLayout layout, int64_t length, int parts, int index) {
  int64_t rows = 0;
  for (const IndexRun& run : layout_runs(layout, length, parts, index)) rows += run.count;
  return rows;
}

int64_t layout_max_rows(SequenceLayout layout, int64_t length, int parts) {
  int64_t most = 0;
  for (int r = 0; r < parts; ++r) most = std::max(most, layout_rows(layout, length, parts, r));
  return most;
}

std::vector<int64_t> layout_indices(SequenceLayout layout, int64_t length, int parts, int index) {
  std::vector<int64_t> out;
  for (const IndexRun& run : layout_runs(layout, length, parts, index))
    for (int64_t i = 0; i < run.count; ++i) out.push_back(run.start + i * run.stride);
  return out;
}

}  // namespace ra
