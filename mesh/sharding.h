// PartitionSpec and NamedSharding, as in jax.sharding: one spec entry per tensor dimension naming
// the mesh axes it is split over (none: replicated; several: split over their product, the first
// axis outermost). A NamedSharding maps a global shape and a rank to that rank's offsets and extents.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mesh/mesh_shape.h"
#include "runtime/tensor.h"

namespace ra {

struct PartitionSpec {
  std::vector<std::vector<std::string>> dims;  // dims[i]: the mesh axes of tensor dimension i

  PartitionSpec() = default;
  PartitionSpec(std::initializer_list<std::vector<std::string>> entries) : dims(entries) {}
  // "dp,sp,tp,_" : one entry per dimension, '_' (or None) replicated, "a+b" split over a and b.
  static PartitionSpec parse(const std::string& text);
  std::string str() const;
};

struct LocalSlice {
  std::vector<int64_t> offset, extent;   // per dimension, in global coordinates
  std::vector<int> parts, part_index;    // how many pieces each dimension is cut into, and which is ours
};

class NamedSharding {
 public:
  NamedSharding(MeshShape mesh, PartitionSpec spec);
  // The slice of `global` that `rank` holds. Throws when a dimension does not divide by its axes,
  // naming the tensor, the dimension and the axes.
  LocalSlice local_slice(const Shape& global, int rank, const char* tensor) const;
  const MeshShape& mesh() const { return mesh_; }
  const PartitionSpec& spec() const { return spec_; }

 private:
  MeshShape mesh_;
  PartitionSpec spec_;
};

}  // namespace ra
