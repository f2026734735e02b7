// DeviceMesh: a MeshShape laid over the MPI world, with one communicator per axis (the ranks that
// differ only in that axis' coordinate, ordered by it).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "collectives/mpi_communicator.h"
#include "mesh/mesh_shape.h"

namespace ra {

class DeviceMesh {
 public:
  // The mesh must have exactly as many ranks as `world`; the message says both numbers otherwise.
  DeviceMesh(MeshShape shape, const MpiCommunicator& world);

  const MeshShape& shape() const { return shape_; }
  int rank() const { return rank_; }
  std::vector<int> coords() const { return shape_.coords(rank_); }
  Communicator& axis(const std::string& name) const;

 private:
  MeshShape shape_;
  int rank_;
  std::map<std::string, std::unique_ptr<MpiCommunicator>> axes_;
};

}  // namespace ra
