// Sequence layouts as runs of global indices.
#include "mesh/sequence_layout.h"

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

void check_layout_divides(SequenceLayout layout, int64_t length, int parts, const char* what) {
  const int64_t pieces = layout == SequenceLayout::kZigzag ? 2 * int64_t(parts) : parts;
  RA_CHECK(length % pieces == 0, what, " has length ", length, ", which the ", layout_name(layout),
           " layout cannot split over ", parts, " ranks: expected a multiple of ", pieces);
}

std::vector<IndexRun> layout_runs(SequenceLayout layout, int64_t length, int parts, int index) {
  check_layout_divides(layout, length, parts, "the sequence");
  switch (layout) {
    case SequenceLayout::kContiguous: {
      const int64_t n = length / parts;
      return {{index * n, n, 1}};
    }
    case SequenceLayout::kZigzag: {
      const int64_t n = length / (2 * int64_t(parts));
      return {{index * n, n, 1}, {(2 * int64_t(parts) - 1 - index) * n, n, 1}};
    }
    case SequenceLayout::kStriped: return {{index, length / parts, parts}};
  }
  return {};
}

std::vector<int64_t> layout_indices(SequenceLayout layout, int64_t length, int parts, int index) {
  std::vector<int64_t> out;
  for (const IndexRun& run : layout_runs(layout, length, parts, index))
    for (int64_t i = 0; i < run.count; ++i) out.push_back(run.start + i * run.stride);
  return out;
}

}  // namespace ra
