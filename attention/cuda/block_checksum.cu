#include "attention/cuda/block_checksum.h"

#include "runtime/cuda_device.h"
#include "runtime/fault_injection.h"

namespace ra {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ uint64_t mixed_word(uint64_t word, size_t index) {
  return mix64(word ^ (index * 0x9e3779b97f4a7c15ull));
}

// Word pairs as 16-byte loads, kLoads of them in flight per thread: with one 8-byte load at a time the
// kernel waited on memory latency and held its SMs several times longer (the ring's first checksum
// runs at high priority beside the attention kernel). The data is 16-byte aligned (block buffers).
constexpr int kLoads = 4;

__global__ void checksum_kernel(const uint64_t* words, size_t count, unsigned long long* sum) {
  const auto* pairs = reinterpret_cast<const ulonglong2*>(words);
  const size_t pair_count = count / 2, stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  uint64_t local = 0;
  for (; i + (kLoads - 1) * stride < pair_count; i += kLoads * stride) {
    ulonglong2 v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) v[u] = pairs[i + u * stride];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const size_t w = 2 * (i + u * stride);
      local += mixed_word(v[u].x, w) + mixed_word(v[u].y, w + 1);
    }
  }
  for (; i < pair_count; i += stride) local += mixed_word(pairs[i].x, 2 * i) + mixed_word(pairs[i].y, 2 * i + 1);
  if (count % 2 == 1 && blockIdx.x == 0 && threadIdx.x == 0) local += mixed_word(words[count - 1], count - 1);
  for (int offset = 16; offset > 0; offset >>= 1) local += __shfl_xor_sync(0xffffffffu, local, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, static_cast<unsigned long long>(local));
}

__global__ void trailer_kernel(BlockTrailer* trailer, uint32_t origin_rank) {
  *trailer = BlockTrailer{0, origin_rank, BlockTrailer::kMagic};
}

void launch_checksum(const void* data, size_t bytes, uint64_t* sum, cudaStream_t stream) {
  const size_t count = bytes / 8;
  if (count == 0) return;
  RA_CHECK(reinterpret_cast<uintptr_t>(data) % 16 == 0, "block checksum: the data at ", data,
           " is not 16-byte aligned (the ring's block buffers are)");
  const int threads = 256;
  const size_t per_block = size_t(threads) * kLoads * 2;  // words one pass of a block covers
  const int blocks = int(std::min<size_t>((count + per_block - 1) / per_block, 1024));
  checksum_kernel<<<blocks, threads, 0, stream>>>(static_cast<const uint64_t*>(data), count,
                                                  reinterpret_cast<unsigned long long*>(sum));
  RA_CUDA_CHECK(cudaGetLastError());
}

__global__ void flip_kernel(unsigned char* byte) { *byte ^= kCorruptionMask; }

}  // namespace

void block_checksum_cuda(const void* data, size_t bytes, uint64_t* sum, cudaStream_t stream) {
  RA_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(uint64_t), stream));
  launch_checksum(data, bytes, sum, stream);
}

void seal_block_cuda(void* data, size_t payload, uint32_t origin_rank, cudaStream_t stream) {
  auto* trailer = reinterpret_cast<BlockTrailer*>(static_cast<char*>(data) + payload);
  trailer_kernel<<<1, 1, 0, stream>>>(trailer, origin_rank);
  RA_CUDA_CHECK(cudaGetLastError());
  launch_checksum(data, payload, &trailer->checksum, stream);
}

void flip_byte_cuda(void* data, size_t offset, cudaStream_t stream) {
  flip_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned char*>(data) + offset);
  RA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ra
