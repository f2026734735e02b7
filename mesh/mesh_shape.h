// A mesh's shape: named axes with sizes (e.g. "dp=2,sp=2"), rank <-> coordinates with the last axis
// fastest, as in jax.sharding.Mesh over a row-major device array. Pure data, no communication.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ra {

inline constexpr int64_t kMaxMeshRanks = int64_t(1) << 24;

class MeshShape {
 public:
  MeshShape() = default;
  explicit MeshShape(std::vector<std::pair<std::string, int>> axes);
  static MeshShape parse(const std::string& text);  // "sp=4" or "dp=2,sp=2"

  int size() const;  // number of ranks
  int rank_count() const { return size(); }
  int axis_count() const { return int(axes_.size()); }
  const std::string& axis_name(int i) const { return axes_[size_t(i)].first; }
  int axis_size(int i) const { return axes_[size_t(i)].second; }
  int axis_index(const std::string& name) const;  // throws naming the axis
  int axis_size(const std::string& name) const { return axis_size(axis_index(name)); }
  bool has_axis(const std::string& name) const;
  std::vector<int> coords(int rank) const;
  int rank_of(const std::vector<int>& coords) const;
  // The group of `rank` along axis `axis`, as a communicator split takes it: the ranks that agree on
  // every other coordinate share `color` (the lowest rank among them), ordered by `key` (the coordinate).
  struct AxisGroup {
    int color, key;
  };
  AxisGroup axis_group(int rank, int axis) const;
  std::string str() const;

 private:
  std::vector<std::pair<std::string, int>> axes_;
};

}  // namespace ra
