// One MPI_Comm_split per mesh axis.
#include "mesh/device_mesh.h"

#include "runtime/error.h"

namespace ra {

DeviceMesh::DeviceMesh(MeshShape shape, const MpiCommunicator& world) : shape_(std::move(shape)), rank_(world.rank()) {
  RA_CHECK(shape_.size() == world.size(), "mesh ", shape_.str(), " has ", shape_.size(), " ranks but the job has ",
           world.size(), " (mpirun -np ", world.size(), ")");
  for (int a = 0; a < shape_.axis_count(); ++a) {
    const MeshShape::AxisGroup group = shape_.axis_group(rank_, a);
    axes_[shape_.axis_name(a)] = world.split(group.color, group.key);
  }
}

Communicator& DeviceMesh::axis(const std::string& name) const {
  auto it = axes_.find(name);
  RA_CHECK(it != axes_.end(), "mesh ", shape_.str(), " has no axis '", name, "'");
  return *it->second;
}

}  // namespace ra
