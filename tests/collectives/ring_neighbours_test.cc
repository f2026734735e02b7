// The GPU ring's transport decision with ranks that report different hosts: copy engines only between
// neighbours on one host whose GPUs reach each other; every rank of a ring falls back to NCCL together
// when any rank's next neighbour cannot be reached (PeerCopyRing::supported all-reduces the answer).
#include "collectives/ring_neighbours.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ra {
namespace {

struct Rank {
  std::string host, bus_id;
};

// Each rank's obstacle to its next rank, as PeerCopyRing::supported computes it; `unreachable` names the
// bus ids no GPU can map (peer access missing), and every device question asked is recorded.
std::vector<std::string> obstacles(const std::vector<Rank>& ranks, const std::string& unreachable,
                                   std::vector<std::string>* asked) {
  std::vector<RingNodeInfo> all;
  for (const Rank& r : ranks) all.push_back(ring_node_info(r.host, r.bus_id));
  std::vector<std::string> reasons;
  const int n = int(ranks.size());
  for (int rank = 0; rank < n; ++rank) {
    const int next = (rank + 1) % n;
    reasons.push_back(copy_engine_obstacle(all[size_t(rank)], all[size_t(next)], rank, next, [&](const char* bus) {
      asked->push_back(bus);
      return unreachable == bus ? std::string("no peer access to ") + bus : std::string();
    }));
  }
  return reasons;
}

bool every_rank_uses_copy_engines(const std::vector<std::string>& reasons) {
  for (const std::string& r : reasons)
    if (!r.empty()) return false;
  return true;
}

TEST(RingNeighbours, OneHostUsesCopyEngines) {
  std::vector<std::string> asked;
  const auto reasons = obstacles({{"node-a", "0000:18:00.0"}, {"node-a", "0000:2a:00.0"}, {"node-a", "0000:3a:00.0"}}, "",
                                 &asked);
  EXPECT_TRUE(every_rank_uses_copy_engines(reasons));
  EXPECT_EQ(asked, (std::vector<std::string>{"0000:2a:00.0", "0000:3a:00.0", "0000:18:00.0"}));
}

TEST(RingNeighbours, RanksSharingOneGpuUseCopyEngines) {
  std::vector<std::string> asked;
  EXPECT_TRUE(every_rank_uses_copy_engines(obstacles({{"node-a", "0000:18:00.0"}, {"node-a", "0000:18:00.0"}}, "", &asked)));
}

TEST(RingNeighbours, TwoHostsFallBackToNcclNamingTheRanks) {
  // 2 hosts x 2 ranks: ranks 1 -> 2 and 3 -> 0 cross hosts; the device is never asked for them.
  std::vector<std::string> asked;
  const auto reasons = obstacles({{"node-a", "0000:18:00.0"}, {"node-a", "0000:2a:00.0"}, {"node-b", "0000:18:00.0"},
                                  {"node-b", "0000:2a:00.0"}}, "", &asked);
  EXPECT_FALSE(every_rank_uses_copy_engines(reasons));
  EXPECT_EQ(reasons[0], "");
  EXPECT_EQ(reasons[1], "rank 1 and its next rank 2 run on different nodes");
  EXPECT_EQ(reasons[2], "");
  EXPECT_EQ(reasons[3], "rank 3 and its next rank 0 run on different nodes");
  EXPECT_EQ(asked.size(), 2u);  // only ranks 0 and 2, whose next ranks share their host
}

TEST(RingNeighbours, SameBusIdOnAnotherHostIsAnotherGpu) {
  // Equal bus ids on two hosts (the usual case: identical nodes) must not read as one GPU.
  std::vector<std::string> asked;
  const auto reasons = obstacles({{"node-a", "0000:18:00.0"}, {"node-b", "0000:18:00.0"}}, "", &asked);
  EXPECT_EQ(reasons[0], "rank 0 and its next rank 1 run on different nodes");
  EXPECT_EQ(reasons[1], "rank 1 and its next rank 0 run on different nodes");
  EXPECT_TRUE(asked.empty());
}

TEST(RingNeighbours, NoPeerAccessOnOneHostFallsBack) {
  std::vector<std::string> asked;
  const auto reasons = obstacles({{"node-a", "0000:18:00.0"}, {"node-a", "0000:2a:00.0"}}, "0000:2a:00.0", &asked);
  EXPECT_EQ(reasons[0], "no peer access to 0000:2a:00.0");
  EXPECT_EQ(reasons[1], "");
  EXPECT_FALSE(every_rank_uses_copy_engines(reasons));
}

TEST(RingNeighbours, LongBusIdIsCutNotOverrun) {
  const RingNodeInfo info = ring_node_info("node-a", std::string(64, 'x'));
  EXPECT_EQ(std::string(info.bus_id), std::string(31, 'x'));
}

}  // namespace
}  // namespace ra
