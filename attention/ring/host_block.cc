#include "attention/ring/host_block.h"

#include <cstring>

#include "runtime/error.h"

namespace ra {

void pack_rows(const TensorView& t, char* dst) {
  const size_t elem = dtype_size(t.dtype());
  const size_t row = size_t(t.dim(3)) * elem;
  for (int64_t b = 0; b < t.dim(0); ++b)
    for (int64_t s = 0; s < t.dim(1); ++s)
      for (int64_t h = 0; h < t.dim(2); ++h) {
        const char* src = static_cast<const char*>(t.data()) + (b * t.stride(0) + s * t.stride(1) + h * t.stride(2)) * int64_t(elem);
        if (t.stride(3) == 1) {
          std::memcpy(dst, src, row);
        } else {
          for (int64_t d = 0; d < t.dim(3); ++d) std::memcpy(dst + d * int64_t(elem), src + d * t.stride(3) * int64_t(elem), elem);
        }
        dst += row;
      }
}

void seal_block(char* block, int origin_rank, size_t payload, bool checksum) {
  const BlockSeal seal{checksum ? block_checksum(block, payload) : 0, uint32_t(origin_rank), BlockSeal::kMagic};
  std::memcpy(block + payload, &seal, sizeof(seal));
}

void check_arrived_block(const char* block, size_t payload, bool checksum, int rank, int from, int step,
                         int expected_origin, const std::string& what) {
  BlockSeal seal;
  std::memcpy(&seal, block + payload, sizeof(seal));
  RA_CHECK(seal.magic == BlockSeal::kMagic && int64_t(seal.origin_rank) == expected_origin, "ring step ", step,
           ": rank ", rank, " received a malformed ", what, " from rank ", from, " (its seal says origin rank ",
           seal.origin_rank, ", magic ", std::hex, seal.magic, std::dec, "; expected rank ", expected_origin, ")");
  if (!checksum) return;
  const uint64_t sum = block_checksum(block, payload);
  RA_CHECK(sum == seal.checksum, "ring step ", step, ": rank ", rank, " received the ", what, " of rank ",
           expected_origin, " from rank ", from, " (", payload, " bytes) with checksum ", std::hex, sum,
           " but it was sent with ", seal.checksum, std::dec, ": the block was corrupted in flight and was not used");
}

BlockBuffers::BlockBuffers(size_t payload, int count) {
  RA_CHECK(count >= 1 && count <= 3, "BlockBuffers holds 1 to 3 blocks, not ", count);
  for (int i = 0; i < count; ++i) {
    // Zeroed (make_unique value-initialises): unused rows of a short block are zeros under its checksum.
    storage_[i] = std::make_unique<char[]>(sealed_bytes(payload) + 64);
    char* raw = storage_[i].get();
    blocks_[i] = raw + (64 - reinterpret_cast<uintptr_t>(raw) % 64) % 64;
  }
}

void BlockBuffers::abandon() {
  for (auto& s : storage_) (void)s.release();
}

}  // namespace ra
