#include "attention/ring/block_checksum.h"

#include "runtime/cuda_device.h"
#include "runtime/fault_injection.h"

#include <type_traits>

namespace ra {
namespace {

// The sum over 32-bit words x_i of (2i + 1) x_i, mod 2^64: one widening multiply-add per word. The
// previous definition mixed every 64-bit word through SplitMix64 (about 25 integer operations per 8
// bytes); the attention kernel holds each SM's whole register file, so the checksum only runs on SMs
// it leaves idle, and there that arithmetic, not memory, set how long it held them.
// Odd weights: a flipped bit changes the sum by an odd multiple of a power of two below 2^32 (never 0
// mod 2^64); swapping two different words changes it by 2 (i - j) (x_j - x_i), which is not a multiple
// of 2^64 when the words are less than 8 GiB apart (at most 1 + 30 + 31 factors of two); farther
// apart it is missed only when (i - j) (x_j - x_i) ends in 63 zero bits.
// Weights below 2^32 (blocks under 8 GiB, kWide false) take one IMAD.WIDE.U32 per word; larger blocks
// (1M tokens on 2 GPUs holds 8 GiB of K/V) take the 64-bit weights, same sum, one more IMAD per word.
template <bool kWide>
using Weight = std::conditional_t<kWide, uint64_t, uint32_t>;

template <bool kWide>
__device__ __forceinline__ uint64_t weighted(uint32_t word, Weight<kWide> weight, uint64_t sum) {
  return sum + uint64_t(word) * weight;
}

// 16-byte loads, kLoads of them in flight per thread (latency, not bandwidth, is what a lone block on
// an SM waits for). The data is 16-byte aligned (block buffers).
constexpr int kLoads = 4;

// The words of a piece that starts `first_word` words into its block carry the block's weights.
template <bool kWide>
__global__ void checksum_kernel(const uint32_t* words, size_t count, size_t first_word, unsigned long long* sum) {
  const auto* quads = reinterpret_cast<const uint4*>(words);
  const size_t quad_count = count / 4, stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  uint64_t local = 0;
  auto add_quad = [&](const uint4& v, size_t quad) {
    const auto w = Weight<kWide>(2 * (first_word + 4 * quad) + 1);  // the weight of the quad's first word
    local = weighted<kWide>(v.x, w, local);
    local = weighted<kWide>(v.y, w + 2, local);
    local = weighted<kWide>(v.z, w + 4, local);
    local = weighted<kWide>(v.w, w + 6, local);
  };
  for (; i + (kLoads - 1) * stride < quad_count; i += kLoads * stride) {
    uint4 v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) v[u] = quads[i + u * stride];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) add_quad(v[u], i + u * stride);
  }
  for (; i < quad_count; i += stride) add_quad(quads[i], i);
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (size_t tail = quad_count * 4; tail < count; ++tail) local = weighted<kWide>(words[tail], Weight<kWide>(2 * (first_word + tail) + 1), local);
  for (int offset = 16; offset > 0; offset >>= 1) local += __shfl_xor_sync(0xffffffffu, local, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, static_cast<unsigned long long>(local));
}

__global__ void seal_kernel(BlockSeal* seal, uint32_t origin_rank) {
  *seal = BlockSeal{0, origin_rank, BlockSeal::kMagic};
}

void launch_checksum(const void* data, size_t bytes, size_t offset, uint64_t* sum, cudaStream_t stream) {
  const size_t count = bytes / 4;
  if (count == 0) return;
  RA_CHECK(reinterpret_cast<uintptr_t>(data) % 16 == 0 && offset % 4 == 0, "block checksum: the data at ", data,
           " is not 16-byte aligned or its offset ", offset, " in the block is not a multiple of 4");
  // Several blocks fit on an SM the attention kernel leaves idle: more loads in flight there.
  const int threads = 512;
  const size_t per_block = size_t(threads) * kLoads * 4;  // words one pass of a block covers
  const int blocks = int(std::min<size_t>((count + per_block - 1) / per_block, 1024));
  const bool wide = 2 * (offset / 4 + count) >= (size_t(1) << 32);  // a weight would not fit 32 bits
  (wide ? checksum_kernel<true> : checksum_kernel<false>)<<<blocks, threads, 0, stream>>>(
      static_cast<const uint32_t*>(data), count, offset / 4, reinterpret_cast<unsigned long long*>(sum));
  RA_CUDA_CHECK(cudaGetLastError());
}

__global__ void flip_kernel(unsigned char* byte) { *byte ^= kCorruptionMask; }

}  // namespace

void block_checksum_cuda(const void* data, size_t bytes, uint64_t* sum, cudaStream_t stream) {
  RA_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(uint64_t), stream));
  launch_checksum(data, bytes, 0, sum, stream);
}

void seal_pieces_cuda(BlockSeal* seal, const std::vector<BlockPiece>& pieces, uint32_t origin_rank,
                      cudaStream_t stream) {
  seal_kernel<<<1, 1, 0, stream>>>(seal, origin_rank);
  RA_CUDA_CHECK(cudaGetLastError());
  for (const BlockPiece& piece : pieces) launch_checksum(piece.data, piece.bytes, piece.offset, &seal->checksum, stream);
}

void seal_block_cuda(void* data, size_t payload, uint32_t origin_rank, cudaStream_t stream) {
  auto* seal = reinterpret_cast<BlockSeal*>(static_cast<char*>(data) + payload);
  seal_pieces_cuda(seal, {BlockPiece{data, 0, payload}}, origin_rank, stream);
}

void flip_byte_cuda(void* data, size_t offset, cudaStream_t stream) {
  flip_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned char*>(data) + offset);
  RA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ra
