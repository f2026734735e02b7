// The block checksum (attention/ring/block_seal.h) of blocks in device memory, for the GPU ring's
// in-flight check: one pass, atomics (the sum mod 2^64 is independent of thread order), no second kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention/ring/block_seal.h"

namespace ra {

// *sum (device) <- the checksum of `bytes` (a multiple of 4, any size) at `data` (device), queued on `stream`.
void block_checksum_cuda(const void* data, size_t bytes, uint64_t* sum, cudaStream_t stream);

// Writes the seal behind `payload` bytes at `data` (device): its checksum and `origin_rank`. All on
// the device: a copy from pageable host memory would make the host wait for the stream.
void seal_block_cuda(void* data, size_t payload, uint32_t origin_rank, cudaStream_t stream);

// The bytes of a block that are not zero: `bytes` at `data` (device, 16-byte aligned), `offset` bytes
// (a multiple of 4) into the block.
struct BlockPiece {
  const void* data;
  size_t offset, bytes;
};

// Writes to `seal` (device) the seal of the block made of `pieces` and zeros elsewhere, without
// the block ever being assembled: zero words add nothing to the checksum.
void seal_pieces_cuda(BlockSeal* seal, const std::vector<BlockPiece>& pieces, uint32_t origin_rank,
                      cudaStream_t stream);

// Test hook for RINGATTN_FAULT=corrupt: XORs kCorruptionMask into the byte at `data + offset` (device).
void flip_byte_cuda(void* data, size_t offset, cudaStream_t stream);

}  // namespace ra
