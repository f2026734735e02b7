// The seal of every block in flight on both rings (host and GPU, K/V blocks and dK/dV accumulators): 16
// bytes behind the payload, holding the payload's checksum and the rank the block started on. K/V blocks
// are sealed once at their origin; the backward's accumulators are resealed by every sender, since each
// rank adds to them.
//
// The checksum: the sum over the payload's little-endian 32-bit words x_i of (2i + 1) x_i, mod 2^64 (a
// position-weighted sum, as Fletcher's and Adler's are; 64-bit weights past 8 GiB). Any flipped bit and
// any swap of two different words less than 8 GiB apart changes it (the weights are odd); other damage
// (a stale or misdirected span) almost surely does. Addition mod 2^64 makes it independent of order:
// the GPU computes it in one pass with atomics (block_checksum.h), the host here; the same bytes give
// the same sum on both.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ra {

struct BlockSeal {
  static constexpr uint32_t kMagic = 0x52414b56;  // "RAKV"
  uint64_t checksum;
  uint32_t origin_rank;
  uint32_t magic;
};
static_assert(sizeof(BlockSeal) == 16);

// The bytes of a sealed block of `payload` bytes: what one shift moves.
constexpr size_t sealed_bytes(size_t payload) { return payload + sizeof(BlockSeal); }

// The checksum of `bytes` at `data` whose first word is word `first_word` of its block (a tail of 1-3
// bytes counts as one word, zero-extended; device blocks are whole words).
uint64_t block_checksum(const void* data, size_t bytes, uint64_t first_word = 0);

}  // namespace ra
