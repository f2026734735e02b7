// Checksums of K/V blocks in device memory, for the GPU ring's in-flight check (the host ring uses
// CRC-32): a 64-bit sum over the block's 8-byte words, each mixed with its index (SplitMix64), so
// that a flipped bit, a swapped word or a missing tail changes it. Addition mod 2^64 makes the sum
// independent of thread order: one pass, atomics, no second kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

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

// *sum (device) <- the checksum of `bytes` (a multiple of 8) at `data` (device), queued on `stream`.
void block_checksum_cuda(const void* data, size_t bytes, uint64_t* sum, cudaStream_t stream);

// Writes the trailer behind `payload` bytes at `data` (device): its checksum and `origin_rank`. All on
// the device: a copy from pageable host memory would make the host wait for the stream.
void seal_block_cuda(void* data, size_t payload, uint32_t origin_rank, cudaStream_t stream);

// Test hook for RINGATTN_FAULT=corrupt: XORs kCorruptionMask into the byte at `data + offset` (device).
void flip_byte_cuda(void* data, size_t offset, cudaStream_t stream);

}  // namespace ra
