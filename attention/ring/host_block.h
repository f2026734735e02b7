// A block in flight on the host ring: the payload, then its seal (attention/ring/block_seal.h, the same
// 16 bytes as on the GPU ring: the payload's checksum and the rank the block started on). K/V blocks are
// sealed once at their origin; the backward's dK/dV accumulators are resealed by every sender.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "attention/ring/block_seal.h"
#include "runtime/tensor.h"

namespace ra {

// Copies a (B, S, H, D) view into contiguous bytes.
void pack_rows(const TensorView& t, char* dst);

// Writes the seal behind the `payload` bytes at `block`: its origin and, when `checksum`, its checksum
// (0 otherwise).
void seal_block(char* block, int origin_rank, size_t payload, bool checksum);

// A block that arrived at `step` from rank `from` must carry `expected_origin`'s seal and, when
// `checksum`, the bytes it was sealed with; anything else is reported naming `what` (never used).
void check_arrived_block(const char* block, size_t payload, bool checksum, int rank, int from, int step,
                         int expected_origin, const std::string& what);

// One to three zeroed host buffers of sealed_bytes(payload), 64-byte aligned (for the SIMD kernels).
// After a failed exchange MPI may still write into them: `abandon` leaks them.
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
