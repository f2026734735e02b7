// Hopper's TMA stores: a tile that a block laid out in shared memory as the loads of tma.cuh leave one, written to
// global memory by the copy engine from one thread instead of by every thread's stores, which queue in the load /
// store unit behind whatever the block issued before (the wgmma backward's dQ atomics).
#pragma once

#include "attention/cuda/tma.cuh"

namespace ra::tma {

// The box at coordinates (c0 innermost .. c3) of `map` from shared memory at src, in this thread's bulk group;
// coordinates past the tensor's dims are not written.
__device__ __forceinline__ void store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
               "r"(smem_address(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// A tile laid out as load_row_slabs leaves one (D / kCols slabs of kRows x kCols) stored to rows row0.. of one head
// and batch of `map`, one box a slab. The writes to src must be fenced to the async proxy (wgmma::fence_shared_writes)
// and the block's writers past a barrier first.
template <int kRows, int D, int kCols, typename T>
__device__ __forceinline__ void store_row_slabs(const CUtensorMap* map, const T* src, int row0, int head, int batch) {
#pragma unroll
  for (int slab = 0; slab < D / kCols; ++slab)
    store_4d(map, src + slab * kRows * kCols, slab * kCols, row0, head, batch);
}

// Waits until every bulk store this thread started has read its shared memory (which may then be reused, or the
// block exit); their writes to global memory complete on their own.
__device__ __forceinline__ void wait_stores_read() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

}  // namespace ra::tma
