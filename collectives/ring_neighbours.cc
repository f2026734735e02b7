#include "collectives/ring_neighbours.h"

#include <algorithm>

#include "runtime/error.h"

namespace ra {

RingNodeInfo ring_node_info(std::string_view host_name, std::string_view bus_id) {
  RingNodeInfo info;
  info.host_hash = std::hash<std::string_view>{}(host_name);
  std::copy_n(bus_id.data(), std::min(bus_id.size(), sizeof(info.bus_id) - 1), info.bus_id);
  return info;
}

std::string copy_engine_obstacle(const RingNodeInfo& mine, const RingNodeInfo& next, int rank, int next_rank,
                                 const std::function<std::string(const char* next_bus_id)>& device_obstacle) {
  if (next.host_hash != mine.host_hash)
    return detail::concat("rank ", rank, " and its next rank ", next_rank, " run on different nodes");
  return device_obstacle(next.bus_id);
}

}  // namespace ra
