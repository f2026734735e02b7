// The single-process communicator.
#include "collectives/communicator.h"

#include <cstring>

namespace ra {
namespace {
class DoneExchange final : public PendingExchange {
 public:
  void wait(std::chrono::milliseconds) override {}
};
}  // namespace

std::unique_ptr<PendingExchange> SelfCommunicator::ring_shift(const void* send, void* recv, size_t bytes, int) {
  if (send != recv) std::memmove(recv, send, bytes);
  return std::make_unique<DoneExchange>();
}

void SelfCommunicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
  if (send != recv) std::memmove(recv, send, bytes_per_rank);
}

}  // namespace ra
