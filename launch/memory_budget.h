// Whether a job's slices fit before anything is allocated: a file whose header claims a huge shape
// (nothing stored, chunked) or inputs too large for the machine are refused by name on every rank,
// instead of one rank failing an allocation and the others being killed.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ra::cli {

// One thing a rank will hold: what it is (a dataset's slice with its shape) and its bytes.
struct MemoryNeed {
  std::string what;
  uint64_t bytes;
};

// Host memory: the sum over this node's ranks must fit the node's available memory (MemAvailable),
// and each rank's own sum its address-space and data limits (ulimit -v / -d). Collective over
// `world`: every rank fails when any does, the ones over budget naming their needs.
void check_host_memory(const std::vector<MemoryNeed>& needs, const std::string& input, MPI_Comm world);

// Device memory: this rank's needs against the free memory of its GPU. Collective over `world`.
void check_device_memory(const std::vector<MemoryNeed>& needs, uint64_t free_bytes, MPI_Comm world);

}  // namespace ra::cli
