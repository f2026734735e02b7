// PartitionSpec parsing and NamedSharding's slice arithmetic.
#include "mesh/sharding.h"

#include "runtime/error.h"

namespace ra {

PartitionSpec PartitionSpec::parse(const std::string& text) {
  PartitionSpec spec;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    std::vector<std::string> axes;
    if (item != "_" && item != "None" && !item.empty()) {
      size_t a = 0;
      while (a <= item.size()) {
        size_t b = item.find('+', a);
        if (b == std::string::npos) b = item.size();
        axes.push_back(item.substr(a, b - a));
        a = b + 1;
      }
    }
    spec.dims.push_back(axes);
    start = end + 1;
  }
  return spec;
}

std::string PartitionSpec::str() const {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) {
    s += i ? ", " : "";
    if (dims[i].empty()) s += "None";
    for (size_t j = 0; j < dims[i].size(); ++j) s += (j ? "+" : "") + dims[i][j];
  }
  return s + ")";
}

NamedSharding::NamedSharding(MeshShape mesh, PartitionSpec spec) : mesh_(std::move(mesh)), spec_(std::move(spec)) {
  std::vector<std::string> used;
  for (const auto& axes : spec_.dims)
    for (const auto& axis : axes) {
      mesh_.axis_index(axis);  // throws for an unknown axis
      for (const auto& u : used) RA_CHECK(u != axis, "PartitionSpec ", spec_.str(), " uses mesh axis '", axis, "' twice");
      used.push_back(axis);
    }
}

LocalSlice NamedSharding::local_slice(const Shape& global, int rank, const char* tensor) const {
  RA_CHECK(int(spec_.dims.size()) <= global.rank, tensor, ": PartitionSpec ", spec_.str(), " has ",
           spec_.dims.size(), " entries for a tensor of rank ", global.rank);
  std::vector<int> coords = mesh_.coords(rank);
  LocalSlice s;
  for (int d = 0; d < global.rank; ++d) {
    int parts = 1, index = 0;
    std::string names;
    if (d < int(spec_.dims.size()))
      for (const std::string& axis : spec_.dims[size_t(d)]) {
        int a = mesh_.axis_index(axis);
        parts *= mesh_.axis_size(a);
        index = index * mesh_.axis_size(a) + coords[size_t(a)];
        names += (names.empty() ? "" : "+") + axis;
      }
    RA_CHECK(global[d] % parts == 0, tensor, " dimension ", d, " has size ", global[d],
             ", which does not divide over mesh axis '", names, "' of size ", parts);
    const int64_t extent = global[d] / parts;
    s.offset.push_back(extent * index);
    s.extent.push_back(extent);
    s.parts.push_back(parts);
    s.part_index.push_back(index);
  }
  return s;
}

}  // namespace ra
