// Hopper's warpgroup MMA (wgmma, sm_90a) as small inline-PTX wrappers: shared-memory matrix
// descriptors for the 128- and 64-byte swizzles, the fence / commit / wait protocol, and the shapes the
// flash kernels issue (N = 32, 64, 96, 128). A warpgroup is 4 consecutive warps; every wgmma is issued
// by all 128 threads.
// Accumulators use the fragment layout of flash_tile.cuh: d[j][0..3] is column group j of the
// thread's rows lane / 4 and lane / 4 + 8 within its warp's 16 rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace ra::wgmma {

// Tiles of 16-bit values in shared memory as wgmma reads them: columns in slabs of kSwizzleBytes-wide rows
// (128: 64 columns, 64: 32 columns), each slab holding every row of the tile, and the 16-byte chunk c of
// row r stored at c ^ (r / (8 / kChunks) % kChunks) (the pattern repeats over 8 rows, 8 x kSwizzleBytes bytes).
// The 64-byte form serves head dims whose warpgroup shares are multiples of 32 columns but not of 64 (an
// MN-major operand's N axis must cover whole slabs).
template <int kSwizzleBytes>
struct Slabs {
  static_assert(kSwizzleBytes == 128 || kSwizzleBytes == 64, "the 128- and 64-byte swizzles");
  static constexpr uint32_t kRowBytes = kSwizzleBytes, kAtomBytes = 8 * kSwizzleBytes;
  static constexpr int kCols = kSwizzleBytes / 2, kChunks = kSwizzleBytes / 16;
  static constexpr int kKSteps = kCols / 16;  // k-steps of 16 columns per slab (K-major operands)

  // Element offset of chunk `chunk` (of 8 columns) of row `row` in a tile of kRows rows.
  template <int kRows>
  static __device__ __forceinline__ int offset(int row, int chunk) {
    return (chunk / kChunks) * kRows * kCols + row * kCols + (((chunk % kChunks) ^ (row / (8 / kChunks) % kChunks)) << 3);
  }

  // The descriptor of a tile at `smem_byte_address`; `lbo` and `sbo` in bytes: for a K-major operand sbo
  // is the step between 8-row groups (kAtomBytes; lbo unused); for an MN-major one lbo is the step
  // between column slabs and sbo the step between groups of 8 k-rows.
  static __device__ __forceinline__ uint64_t desc(uint32_t smem_byte_address, uint32_t lbo, uint32_t sbo) {
    constexpr uint64_t kMode = kSwizzleBytes == 128 ? 1 : 2;  // the descriptor's swizzle field, bits 62-63
    return uint64_t((smem_byte_address & 0x3FFFF) >> 4) | uint64_t((lbo >> 4) & 0x3FFF) << 16 |
           uint64_t((sbo >> 4) & 0x3FFF) << 32 | kMode << 62;
  }
};

// The 128-byte form, which the forward kernel uses throughout.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_byte_address, uint32_t lbo, uint32_t sbo) {
  return Slabs<128>::desc(smem_byte_address, lbo, sbo);
}
constexpr uint32_t kRowBytes = Slabs<128>::kRowBytes, kSwizzleAtom = Slabs<128>::kAtomBytes;

// The first byte of dynamic shared memory at or after `raw` on the swizzle atom's 1024-byte boundary,
// where wgmma expects tiles to start (reserve kSwizzleAtom bytes of slack for it).
__device__ __forceinline__ unsigned char* align_to_swizzle_atom(unsigned char* raw) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  return raw + (kSwizzleAtom - address % kSwizzleAtom) % kSwizzleAtom;
}

template <int kRows>
__device__ __forceinline__ int slab_offset(int row, int chunk) {
  return Slabs<128>::offset<kRows>(row, chunk);
}

// The descriptor of the same tile `bytes` further on (a k-step or slab inside it): the start address
// field holds the address / 16, and tiles stay below 256 KiB, so the sum never carries out of it.
__device__ __forceinline__ uint64_t advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Registers written by ordinary instructions must be fenced before a wgmma reads them.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Shared memory written through the generic proxy (cp.async, st.shared) made visible to wgmma.
__device__ __forceinline__ void fence_shared_writes() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// `work` (initialising mbarriers, starting the first TMA copies) by thread 0 alone, then its warp
// reconverged. Without the explicit reconvergence ptxas may keep thread 0 apart from the rest of warp 0
// until the kernel's end, and wgmma, which a warp must issue converged, then stops the kernel with an
// illegal instruction: the forward's carry instances did (bench/RESULTS.md). Thread 0's work inside a step
// stays a plain branch, which ptxas reconverges where it ends: the extra warp barrier cost the forward
// 3-5% at D = 192 / 256. bench/check_wgmma_convergence.py checks a build for wgmma a warp may issue diverged.
template <typename Work>
__device__ __forceinline__ void by_thread_zero(int tid, Work&& work) {
  if (tid == 0) work();
  __syncwarp();
}

// Two warpgroups of a block taking turns to issue their products (FlashAttention-3's ping-pong): one
// issues, passes the turn, and runs its softmax on the CUDA cores while the other's products run on the
// tensor cores, instead of both waiting for their products at once. Named barriers 1 and 2 (0 is
// __syncthreads): warpgroup g waits on 1 + g, which the other warpgroup's 128 threads arrive at.
struct IssueTurns {
  int group;  // 0 or 1
  // Warpgroup 0 issues first: warpgroup 1 hands it the first turn.
  __device__ __forceinline__ void start() const {
    if (group == 1) pass();
  }
  __device__ __forceinline__ void wait() const { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + group) : "memory"); }
  __device__ __forceinline__ void pass() const { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - group) : "memory"); }
  // Warpgroup 0 takes the turn warpgroup 1 passed last, so that no arrival is left pending.
  __device__ __forceinline__ void finish() const {
    if (group == 0) wait();
  }
};

// Keeps the compiler from moving reads or writes of accumulators across a wgmma wait or fence, and
// keeps A registers alive (not reused) until the wgmma reading them has been waited for.
template <int NT>
__device__ __forceinline__ void pin(float (&d)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[j][e])::"memory");
}

#define RA_WGMMA_ACC16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define RA_WGMMA_ACC32 RA_WGMMA_ACC16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define RA_WGMMA_ACC48 RA_WGMMA_ACC32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define RA_WGMMA_ACC64 RA_WGMMA_ACC32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define RA_WGMMA_ROW(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define RA_WGMMA_OUT16 RA_WGMMA_ROW(0), RA_WGMMA_ROW(1), RA_WGMMA_ROW(2), RA_WGMMA_ROW(3)
#define RA_WGMMA_OUT32 \
    RA_WGMMA_OUT16, RA_WGMMA_ROW(4), RA_WGMMA_ROW(5), RA_WGMMA_ROW(6), RA_WGMMA_ROW(7)
#define RA_WGMMA_OUT48 \
    RA_WGMMA_OUT32, RA_WGMMA_ROW(8), RA_WGMMA_ROW(9), RA_WGMMA_ROW(10), RA_WGMMA_ROW(11)
#define RA_WGMMA_OUT64 \
    RA_WGMMA_OUT48, \
    RA_WGMMA_ROW(12), RA_WGMMA_ROW(13), RA_WGMMA_ROW(14), RA_WGMMA_ROW(15)

// D (64 x N) = A (64 x 16) B (16 x N) (+ D when `accumulate`), both in shared memory; kTransA / kTransB
// set: that operand is MN-major (its M or N axis contiguous) instead of K-major.
#define RA_WGMMA_SS(N, TY, ACC, OUT, DESCS, ONE, TA, TB)                                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ONE ", 0;\n"                                        \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" ACC "}, " DESCS ", p, 1, 1, " \
               #TA ", " #TB ";\n}\n"                                                                    \
               : OUT                                                                                     \
               : "l"(a_desc), "l"(b_desc), "r"(accumulate))
#define RA_WGMMA_SS_NT(TY, TA, TB)                                                                              \
  if constexpr (NT == 16) RA_WGMMA_SS(128, TY, RA_WGMMA_ACC64, RA_WGMMA_OUT64, "%64, %65", "%66", TA, TB);   \
  else if constexpr (NT == 12) RA_WGMMA_SS(96, TY, RA_WGMMA_ACC48, RA_WGMMA_OUT48, "%48, %49", "%50", TA, TB); \
  else if constexpr (NT == 8) RA_WGMMA_SS(64, TY, RA_WGMMA_ACC32, RA_WGMMA_OUT32, "%32, %33", "%34", TA, TB); \
  else RA_WGMMA_SS(32, TY, RA_WGMMA_ACC16, RA_WGMMA_OUT16, "%16, %17", "%18", TA, TB)
#define RA_WGMMA_SS_TY(TY)                                             \
  if constexpr (!kTransA && !kTransB) { RA_WGMMA_SS_NT(TY, 0, 0); }   \
  else if constexpr (kTransA && kTransB) { RA_WGMMA_SS_NT(TY, 1, 1); } \
  else if constexpr (kTransA) { RA_WGMMA_SS_NT(TY, 1, 0); }           \
  else { RA_WGMMA_SS_NT(TY, 0, 1); }

template <typename T, int NT, bool kTransA = false, bool kTransB = false>
__device__ __forceinline__ void mma_ss(float (&d)[NT][4], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  static_assert(NT == 4 || NT == 8 || NT == 12 || NT == 16, "N = 32, 64, 96 or 128");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) { RA_WGMMA_SS_TY("bf16") }
  else { RA_WGMMA_SS_TY("f16") }
}

// D (64 x N) += A (64 x 16, registers) B (16 x N, MN-major in shared memory, so transposed).
#define RA_WGMMA_RS_TB(N, TY, ACC, OUT, AREGS, DESC, ONE)                                         \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ONE ", 0;\n"                                     \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" ACC "}, {" AREGS "}, " \
               DESC ", p, 1, 1, 1;\n}\n"                                                            \
               : OUT                                                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1))

#define RA_WGMMA_RS_TB_NT(TY)                                                                                     \
  if constexpr (NT == 16) RA_WGMMA_RS_TB(128, TY, RA_WGMMA_ACC64, RA_WGMMA_OUT64, "%64, %65, %66, %67", "%68", "%69"); \
  else if constexpr (NT == 12) RA_WGMMA_RS_TB(96, TY, RA_WGMMA_ACC48, RA_WGMMA_OUT48, "%48, %49, %50, %51", "%52", "%53"); \
  else if constexpr (NT == 8) RA_WGMMA_RS_TB(64, TY, RA_WGMMA_ACC32, RA_WGMMA_OUT32, "%32, %33, %34, %35", "%36", "%37"); \
  else RA_WGMMA_RS_TB(32, TY, RA_WGMMA_ACC16, RA_WGMMA_OUT16, "%16, %17, %18, %19", "%20", "%21")

template <typename T, int NT>
__device__ __forceinline__ void mma_rs_tb(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t b_desc) {
  static_assert(NT == 4 || NT == 8 || NT == 12 || NT == 16, "N = 32, 64, 96 or 128");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) { RA_WGMMA_RS_TB_NT("bf16"); }
  else { RA_WGMMA_RS_TB_NT("f16"); }
}

#undef RA_WGMMA_SS
#undef RA_WGMMA_SS_NT
#undef RA_WGMMA_SS_TY
#undef RA_WGMMA_RS_TB
#undef RA_WGMMA_RS_TB_NT
#undef RA_WGMMA_ACC16
#undef RA_WGMMA_ACC32
#undef RA_WGMMA_ACC48
#undef RA_WGMMA_ACC64
#undef RA_WGMMA_OUT16
#undef RA_WGMMA_OUT32
#undef RA_WGMMA_OUT48
#undef RA_WGMMA_OUT64
#undef RA_WGMMA_ROW

}  // namespace ra::wgmma
