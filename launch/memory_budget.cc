// Up-front memory checks: /proc/meminfo and rlimits on the host, cudaMemGetInfo on the device.
#include "launch/memory_budget.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "runtime/error.h"

namespace ra::cli {
namespace {

// MemAvailable of /proc/meminfo in bytes (what can be allocated without swapping); max when unknown.
uint64_t host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return std::numeric_limits<uint64_t>::max();
}

uint64_t process_limit_bytes() {
  uint64_t limit = std::numeric_limits<uint64_t>::max();
  for (int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    struct rlimit r {};
    if (::getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY) limit = std::min<uint64_t>(limit, r.rlim_cur);
  }
  return limit;
}

uint64_t total(const std::vector<MemoryNeed>& needs) {
  uint64_t sum = 0;
  for (const MemoryNeed& n : needs) sum = sum > std::numeric_limits<uint64_t>::max() - n.bytes ? std::numeric_limits<uint64_t>::max() : sum + n.bytes;
  return sum;
}

std::string listing(const std::vector<MemoryNeed>& needs) {
  std::ostringstream out;
  for (const MemoryNeed& n : needs) out << (out.tellp() > 0 ? ", " : "") << n.what << " " << n.bytes << " bytes";
  return out.str();
}

// Every rank learns whether any rank failed; a rank that failed throws its own message, the others
// say which rank to read.
void agree(bool ok, const std::string& message, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  const int mine = ok ? size : rank;  // the lowest failing rank, or size when none failed
  int first_failing = size;
  MPI_Allreduce(&mine, &first_failing, 1, MPI_INT, MPI_MIN, world);
  RA_CHECK(ok, message);
  RA_CHECK(first_failing == size, "rank ", first_failing, " cannot hold its share of the inputs (see its message); "
           "nothing was allocated");
}

}  // namespace

void check_host_memory(const std::vector<MemoryNeed>& needs, const std::string& input, MPI_Comm world) {
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  const uint64_t mine = total(needs);
  uint64_t node_sum = 0;
  int ranks_here = 1;
  MPI_Allreduce(&mine, &node_sum, 1, MPI_UINT64_T, MPI_SUM, node);
  MPI_Comm_size(node, &ranks_here);
  MPI_Comm_free(&node);
  const uint64_t available = host_available_bytes(), limit = process_limit_bytes();
  std::ostringstream why;
  if (mine > limit) {
    why << "input '" << input << "': this rank needs " << mine << " bytes of host memory (" << listing(needs)
        << ") but may allocate at most " << limit << " (ulimit -v / -d)";
  } else if (node_sum > available) {
    why << "input '" << input << "': this rank needs " << mine << " bytes of host memory (" << listing(needs) << "), "
        << ranks_here << " rank(s) on this node " << node_sum << " together, but the node has " << available
        << " bytes available (MemAvailable): use more nodes or ranks, or smaller inputs";
  }
  agree(why.str().empty(), why.str(), world);
}

void check_device_memory(const std::vector<MemoryNeed>& needs, uint64_t free_bytes, MPI_Comm world) {
  const uint64_t mine = total(needs);
  std::ostringstream why;
  if (mine > free_bytes)
    why << "this rank needs " << mine << " bytes of GPU memory (" << listing(needs) << ") but its GPU has "
        << free_bytes << " bytes free: use more GPUs, or smaller inputs";
  agree(why.str().empty(), why.str(), world);
}

}  // namespace ra::cli
