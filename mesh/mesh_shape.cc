// MeshShape parsing and rank <-> coordinate maps.
#include "mesh/mesh_shape.h"

#include <charconv>

#include "runtime/error.h"

namespace ra {

MeshShape::MeshShape(std::vector<std::pair<std::string, int>> axes) : axes_(std::move(axes)) {
  RA_CHECK(!axes_.empty(), "a mesh needs at least one axis");
  for (size_t i = 0; i < axes_.size(); ++i) {
    RA_CHECK(!axes_[i].first.empty(), "mesh axis ", i, " has no name");
    RA_CHECK(axes_[i].second >= 1, "mesh axis '", axes_[i].first, "' has size ", axes_[i].second,
             ", expected a size >= 1");
    for (size_t j = 0; j < i; ++j)
      RA_CHECK(axes_[j].first != axes_[i].first, "mesh axis '", axes_[i].first, "' appears twice");
  }
  // The product of the sizes is a rank count: bounded, so that it never overflows an int (found by
  // the CLI fuzz target: --mesh a=2044564350,b=2).
  int64_t ranks = 1;
  for (const auto& axis : axes_) {
    ranks *= axis.second;
    RA_CHECK(ranks <= kMaxMeshRanks, "mesh '", str(), "' has more than ", kMaxMeshRanks, " ranks");
  }
}

MeshShape MeshShape::parse(const std::string& text) {
  std::vector<std::pair<std::string, int>> axes;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    size_t eq = item.find('=');
    RA_CHECK(eq != std::string::npos && eq > 0, "mesh '", text, "': item '", item, "' is not name=size");
    int size = 0;
    const char* first = item.data() + eq + 1;
    const char* last = item.data() + item.size();
    auto [ptr, ec] = std::from_chars(first, last, size);
    RA_CHECK(ec == std::errc() && ptr == last, "mesh '", text, "': size of axis '", item.substr(0, eq), "' is '",
             item.substr(eq + 1), "', expected a positive integer");
    axes.emplace_back(item.substr(0, eq), size);
    start = end + 1;
  }
  return MeshShape(std::move(axes));
}

int MeshShape::size() const {
  int n = 1;
  for (const auto& axis : axes_) n *= axis.second;
  return n;
}

int MeshShape::axis_index(const std::string& name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].first == name) return int(i);
  RA_FAIL("mesh ", str(), " has no axis '", name, "'");
}

bool MeshShape::has_axis(const std::string& name) const {
  for (const auto& axis : axes_)
    if (axis.first == name) return true;
  return false;
}

std::vector<int> MeshShape::coords(int rank) const {
  RA_CHECK(rank >= 0 && rank < size(), "rank ", rank, " is outside mesh ", str());
  std::vector<int> c(axes_.size());
  for (int i = int(axes_.size()) - 1; i >= 0; --i) {
    c[size_t(i)] = rank % axes_[size_t(i)].second;
    rank /= axes_[size_t(i)].second;
  }
  return c;
}

int MeshShape::rank_of(const std::vector<int>& coords) const {
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) rank = rank * axes_[i].second + coords[i];
  return rank;
}

MeshShape::AxisGroup MeshShape::axis_group(int rank, int axis) const {
  std::vector<int> c = coords(rank);
  const int key = c[size_t(axis)];
  c[size_t(axis)] = 0;
  return {rank_of(c), key};
}

std::string MeshShape::str() const {
  std::string s;
  for (const auto& [name, size] : axes_) s += (s.empty() ? "" : ",") + name + "=" + std::to_string(size);
  return s;
}

}  // namespace ra
