// One MPI_Comm_split per mesh axis.
#include "mesh/device_mesh.h"

#include "runtime/error.h"

namespace ra {

DeviceMesh::DeviceMesh(MeshShape shape, const MpiCommunicator& world) : shape_(std::move(shape)), rank_(world.rank()) {
  RA_CHECK(shape_.size() == world.size(), "mesh ", shape_.str(), " has ", shape_.size(), " ranks but the job has ",
           world.size(), " (mpirun -np ", world.size(), ")");
  const std::vector<int> mine = shape_.coords(rank_);
  for (int a = 0; a < shape_.axis_count(); ++a) {
    std::vector<int> others = mine;
    others[size_t(a)] = 0;  // ranks that agree on every other axis share a color
    axes_[shape_.axis_name(a)] = world.split(shape_.rank_of(others), mine[size_t(a)]);
  }
}

Communicator& DeviceMesh::axis(const std::string& name) const {
  auto it = axes_.find(name);
  RA_CHECK(it != axes_.end(), "mesh ", shape_.str(), " has no axis '", name, "'");
  return *it->second;
}

}  // namespace ra
