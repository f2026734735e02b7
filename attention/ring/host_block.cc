#include "attention/ring/host_block.h"

#include <cstring>

#include "runtime/checksum.h"
#include "runtime/error.h"

namespace ra {
namespace {

struct BlockHeader {
  uint32_t magic = 0x52414b56;  // "RAKV"
  int32_t origin_rank = -1;
  uint32_t crc = 0;
  uint32_t verified = 0;  // 1 when `crc` was computed (checksums on)
  uint64_t payload_bytes = 0;
};
static_assert(sizeof(BlockHeader) <= kBlockHeaderBytes);

}  // namespace

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
  BlockHeader header;
  header.origin_rank = origin_rank;
  header.payload_bytes = payload;
  header.verified = checksum;
  if (checksum) header.crc = crc32_bytes(block + kBlockHeaderBytes, payload);
  std::memcpy(block, &header, sizeof(header));
}

void check_arrived_block(const char* block, size_t payload, int rank, int from, int step, int expected_origin,
                         const std::string& what) {
  BlockHeader header;
  std::memcpy(&header, block, sizeof(header));
  RA_CHECK(header.magic == BlockHeader{}.magic && header.origin_rank == expected_origin &&
               header.payload_bytes == payload,
           "ring step ", step, ": rank ", rank, " received a malformed ", what, " from rank ", from,
           " (header says origin rank ", header.origin_rank, ", ", header.payload_bytes, " bytes; expected rank ",
           expected_origin, ", ", payload, " bytes)");
  if (!header.verified) return;
  const uint32_t crc = crc32_bytes(block + kBlockHeaderBytes, payload);
  RA_CHECK(crc == header.crc, "ring step ", step, ": rank ", rank, " received the ", what, " of rank ", expected_origin,
           " from rank ", from, " (", payload, " bytes) with CRC-32 ", std::hex, crc, " but it was sent with ",
           header.crc, std::dec, ": the block was corrupted in flight and was not used");
}

BlockBuffers::BlockBuffers(size_t payload, int count) {
  RA_CHECK(count >= 1 && count <= 3, "BlockBuffers holds 1 to 3 blocks, not ", count);
  for (int i = 0; i < count; ++i) {
    // Zeroed (make_unique value-initialises): unused rows of a short block are zeros under its CRC.
    storage_[i] = std::make_unique<char[]>(kBlockHeaderBytes + payload + 64);
    char* raw = storage_[i].get();
    blocks_[i] = raw + (64 - reinterpret_cast<uintptr_t>(raw + kBlockHeaderBytes) % 64) % 64;
  }
}

void BlockBuffers::abandon() {
  for (auto& s : storage_) (void)s.release();
}

}  // namespace ra
