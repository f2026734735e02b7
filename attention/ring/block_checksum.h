// Checksums of K/V blocks in device memory, for the GPU ring's in-flight check (the host ring uses
// CRC-32): the sum over the block's 32-bit words x_i of (2i + 1) x_i, mod 2^64 (a position-weighted
// sum, as Fletcher's and Adler's are), for blocks of any size (64-bit weights past 8 GiB). Any flipped
// bit and any swap of two different words less than 8 GiB apart changes it (the weights are odd);
// other damage (a stale or misdirected span) almost surely does. Addition mod 2^64 makes it
// independent of thread order: one pass, atomics, no second kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ra {

// Behind every block in flight (16 bytes, keeps the payload's alignment): the block's checksum and
// the rank it started on, computed once there and forwarded with the block.
struct BlockTrailer {
  static constexpr uint32_t kMagic = 0x52414b56;  // "RAKV"
  uint64_t checksum;
  uint32_t origin_rank;
  uint32_t magic;
};
static_assert(sizeof(BlockTrailer) == 16);

// *sum (device) <- the checksum of `bytes` (a multiple of 4, any size) at `data` (device), queued on `stream`.
void block_checksum_cuda(const void* data, size_t bytes, uint64_t* sum, cudaStream_t stream);

// Writes the trailer behind `payload` bytes at `data` (device): its checksum and `origin_rank`. All on
// the device: a copy from pageable host memory would make the host wait for the stream.
void seal_block_cuda(void* data, size_t payload, uint32_t origin_rank, cudaStream_t stream);

// The bytes of a block that are not zero: `bytes` at `data` (device, 16-byte aligned), `offset` bytes
// (a multiple of 4) into the block.
struct BlockPiece {
  const void* data;
  size_t offset, bytes;
};

// Writes to `trailer` (device) the trailer of the block made of `pieces` and zeros elsewhere, without
// the block ever being assembled: zero words add nothing to the checksum.
void seal_pieces_cuda(BlockTrailer* trailer, const std::vector<BlockPiece>& pieces, uint32_t origin_rank,
                      cudaStream_t stream);

// Test hook for RINGATTN_FAULT=corrupt: XORs kCorruptionMask into the byte at `data + offset` (device).
void flip_byte_cuda(void* data, size_t offset, cudaStream_t stream);

}  // namespace ra
