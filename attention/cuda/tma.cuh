// Hopper's tensor memory accelerator (TMA) for tiles loaded every step: one thread starts a tile's copy
// from global to shared memory, the copy engine swizzles it as wgmma reads it, and the block waits on an
// mbarrier that counts the bytes landed. The per-thread copies it replaces (cp.async, 16 bytes a thread)
// took registers and issue slots from a kernel bound by both.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "attention/cuda/flash_tile.cuh"

namespace ra::tma {

using flash::smem_address;

__device__ __forceinline__ void init_barrier(uint64_t* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals));
}
// The barriers' initialisation made visible to the copy engine before its first completion.
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also expects `bytes` more to land before the phase completes.
__device__ __forceinline__ void arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes) : "memory");
}

// One plain arrival (a barrier counting threads, not bytes).
__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

__device__ __forceinline__ void wait_phase(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

// The box at coordinates (c0 innermost .. c3) of `map` into shared memory at dst, completing on bar.
// Coordinates past the tensor's dims land as zeros.
__device__ __forceinline__ void load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
          smem_address(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_address(bar))
      : "memory");
}

// A tile of kRows rows x D columns (from row0, of one head and batch of `map`) into shared memory at dst as
// D / kCols slabs of kRows x kCols (a swizzle's layout), one box a slab, completing on bar. The caller
// arrives on bar expecting the bytes (once for all the tiles that land on it).
template <int kRows, int D, int kCols = 64, typename T>
__device__ __forceinline__ void load_row_slabs(T* dst, const CUtensorMap* map, int row0, int head, int batch, uint64_t* bar) {
#pragma unroll
  for (int slab = 0; slab < D / kCols; ++slab) load_4d(dst + slab * kRows * kCols, map, slab * kCols, row0, head, batch, bar);
}

// load_row_slabs of 128-byte slabs, the only tile to land on bar: its bytes expected first.
template <int kRows, int D, typename T>
__device__ __forceinline__ void load_row_tile(T* dst, const CUtensorMap* map, int row0, int head, int batch, uint64_t* bar) {
  arrive_expect_bytes(bar, uint32_t(kRows * D * sizeof(T)));
  load_row_slabs<kRows, D>(dst, map, row0, head, batch, bar);
}

// The landings of up to 32 buffers, each counted by its mbarrier (landed[j]): wait(j) waits for buffer j's
// next one. Each thread keeps the parities it waits for (bit j: buffer j's next).
struct Landings {
  uint64_t* landed;
  uint32_t parities = 0;
  // By one thread before the first load: each of the first `buffers` barriers completes a phase on the
  // loading thread's one arrival and its bytes. (fence_barrier_init follows, once for all of them.)
  __device__ __forceinline__ void init(int buffers) const {
    for (int j = 0; j < buffers; ++j) init_barrier(&landed[j], 1);
  }
  __device__ __forceinline__ void wait(int j) {
    wait_phase(&landed[j], (parities >> j) & 1u);
    parities ^= 1u << j;
  }
};

}  // namespace ra::tma
