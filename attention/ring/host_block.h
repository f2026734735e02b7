// A block in flight on the host ring: a small header (the rank the block started on, its payload size
// and CRC-32) in front of the payload. K/V blocks are sealed once at their origin; the backward's dK/dV
// accumulators are resealed by every sender, since each rank adds to them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/tensor.h"

namespace ra {

constexpr size_t kBlockHeaderBytes = 32;  // keeps the payload 16-byte aligned

// Copies a (B, S, H, D) view into contiguous bytes.
void pack_rows(const TensorView& t, char* dst);

// Writes the header of the block at `block` (payload after kBlockHeaderBytes): its origin, size and,
// when `checksum`, the CRC-32 of the payload.
void seal_block(char* block, int origin_rank, size_t payload, bool checksum);

// A block that arrived at `step` from rank `from` must carry `expected_origin`'s header and the bytes it
// was sealed with; anything else is reported naming `what` (never used).
void check_arrived_block(const char* block, size_t payload, int rank, int from, int step, int expected_origin,
                         const std::string& what);

// Two zeroed host buffers of kBlockHeaderBytes + payload bytes whose payloads are 64-byte aligned (for
// the SIMD kernels). After a failed exchange MPI may still write into them: `abandon` leaks them.
class BlockBuffers {
 public:
  BlockBuffers(size_t payload, int count);
  char* operator[](int i) const { return blocks_[i]; }
  void abandon();

 private:
  std::unique_ptr<char[]> storage_[3];
  char* blocks_[3] = {nullptr, nullptr, nullptr};
};

}  // namespace ra
