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

__global__ void checksum_kernel(const uint64_t* words, size_t count, unsigned long long* sum) {
  uint64_t local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    local += mix64(words[i] ^ (i * 0x9e3779b97f4a7c15ull));
  for (int offset = 16; offset > 0; offset >>= 1) local += __shfl_xor_sync(0xffffffffu, local, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, static_cast<unsigned long long>(local));
}

__global__ void trailer_kernel(BlockTrailer* trailer, uint32_t origin_rank) {
  *trailer = BlockTrailer{0, origin_rank, BlockTrailer::kMagic};
}

void launch_checksum(const void* data, size_t bytes, uint64_t* sum, cudaStream_t stream) {
  const size_t count = bytes / 8;
  if (count == 0) return;
  const int threads = 256;
  const int blocks = int(std::min<size_t>((count + threads - 1) / threads, 1024));
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
