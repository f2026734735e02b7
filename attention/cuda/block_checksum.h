// Checksums of K/V blocks in device memory, for the GPU ring's in-flight check (the host ring uses
// CRC-32): a 64-bit sum over the block's 8-byte words, each mixed with its index (SplitMix64), so
// that a flipped bit, a swapped word or a missing tail changes it. Addition mod 2^64 makes the sum
// independent of thread order: one pass, atomics, no second kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ra {

// *sum (device) <- the checksum of `bytes` (a multiple of 8) at `data` (device), queued on `stream`.
void block_checksum_cuda(const void* data, size_t bytes, uint64_t* sum, cudaStream_t stream);

// Test hook for RINGATTN_FAULT=corrupt: XORs kCorruptionMask into the byte at `data + offset` (device).
void flip_byte_cuda(void* data, size_t offset, cudaStream_t stream);

}  // namespace ra
