// Whether a GPU ring's neighbours can use the copy engines: the next rank must run on the same host and
// its GPU must be this rank's own or reachable by peer access. The decision, apart from MPI and CUDA, so
// that it is tested with ranks that report different hosts.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ra {

// What a rank tells the others about where it runs (exchanged as raw bytes by all_gather).
struct RingNodeInfo {
  uint64_t host_hash = 0;  // hash of the processor (host) name
  char bus_id[32] = {};    // PCI bus id of the rank's current GPU
};

RingNodeInfo ring_node_info(std::string_view host_name, std::string_view bus_id);

// Why `rank`'s copies cannot reach `next_rank` on the copy engines, or "" when they can. Different
// hosts decide alone (the device is not asked); on one host `device_obstacle(next.bus_id)` says why
// the next rank's GPU cannot be reached from this rank's ("" when it can).
std::string copy_engine_obstacle(const RingNodeInfo& mine, const RingNodeInfo& next, int rank, int next_rank,
                                 const std::function<std::string(const char* next_bus_id)>& device_obstacle);

}  // namespace ra
