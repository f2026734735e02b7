// dQ of the wgmma backward by a kernel of its own, for the head dims whose dQ atomics bound the key-block
// kernel (D = 192, 256: one f32 add per element per key block, nearly half its time). A block owns 128
// query rows of one (batch, query head), 64 per warpgroup, and walks the key tiles they see: it recomputes
// S = Q K^T and dP = dO V^T (both operands in shared memory, as the forward's S), forms dS = P (dP - delta)
// from LSE in registers and adds dS K into dQ held in registers (dS as the A operand straight from them, K
// read MN-major, as the forward's P V). Three products instead of the key-block kernel's one for dQ, but
// one add per element per call instead of one per key block. The key-block kernel runs beside it with
// kDqApart (dK and dV only). K and V tiles come by TMA, as the forward's.
#pragma once

#include "attention/cuda/dispatch.cuh"
#include "attention/cuda/flash_backward_rows.cuh"
#include "attention/cuda/flash_cuda.h"
#include "attention/cuda/flash_tile.cuh"
#include "attention/cuda/tensor_map.h"
#include "attention/cuda/tma.cuh"
#include "attention/cuda/wgmma.cuh"
#include "runtime/cuda_device.h"

namespace ra::wgmma_dq {

using namespace flash;

constexpr int kThreads = 256, kWarps = kThreads / 32, kBlockM = 128, kBlockN = 64;
using wgmma::kRowBytes;
using wgmma::kSwizzleAtom;

template <int D>
struct DqKernelTraits {
  // Q and dO stay; K and V tiles stream. At D = 256 a second V buffer would pass shared memory's 227 KiB:
  // V's next tile loads once both warpgroups' dP is done (it has the softmax and dS K to land).
  static constexpr bool kOneVBuffer = D > 192;
  static constexpr size_t kSmemBytes =
      size_t(2 * kBlockM * D + (kOneVBuffer ? 3 : 4) * kBlockN * D) * 2 + kSwizzleAtom;  // + alignment slack
  // dQ of a warpgroup's 64 rows in two products: columns [0, 128) and [128, D), whole 64-column slabs.
  static constexpr int kTilesLow = 16, kTilesHigh = (D - 128) / 8;
  static_assert(D == 192 || D == 256, "the head dims whose dQ atomics bound the key-block kernel");
  static_assert(kSmemBytes <= 227 * 1024, "one block's shared memory on an sm_90 SM");
};

// S = Q K^T or dP = dO V^T of a warpgroup's 64 rows (from `rows`, slabs kBlockM rows apart) against a tile's
// kBlockN keys: both operands K-major, a k-step 32 bytes into a slab; one commit group. (A function: the
// kernel written with lambdas and an early return spilled more at D = 256; this gives the same PTX as the
// loops written out.)
template <typename T, int D>
__device__ __forceinline__ void rows_by_keys(float (&out)[8][4], uint32_t rows, uint32_t keys) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t slab = kk / 4, step = (kk % 4) * 32;
    wgmma::mma_ss<T, 8>(out, wgmma::sw128_desc(rows + slab * kBlockM * kRowBytes + step, 16, kSwizzleAtom),
                        wgmma::sw128_desc(keys + slab * kBlockN * kRowBytes + step, 16, kSwizzleAtom), kk > 0);
  }
  wgmma::commit();
}

// Expects head_dim == value_dim == D, positions-only options (causal, window; no segment ids, soft cap,
// bias, mask or dropout). Adds dQ (times the scale) into g.dq, one atomic add per element.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1) flash_wgmma_dq_kernel(const FlashBackwardArgs g,
                                                                      const __grid_constant__ KvMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Traits = DqKernelTraits<D>;
  const CudaAttentionArgs& a = g.a;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = wgmma::align_to_swizzle_atom(smem_raw);
  T* q_s = reinterpret_cast<T*>(smem);
  T* do_s = q_s + kBlockM * D;
  T* k_s = do_s + kBlockM * D;     // two buffers of kBlockN x D
  T* v_s = k_s + 2 * kBlockN * D;  // one or two
  __shared__ int64_t warp_q_lo[kWarps], warp_q_hi[kWarps];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, group = warp / 4;
  // Causal: later rows see more keys; the longest blocks start first (as the forward's).
  const int m_block = a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int m0 = m_block * kBlockM, h = blockIdx.y, b = blockIdx.z, kh = h / (a.q_heads / a.kv_heads);
  auto query_slabs = [](int r, int c) { return wgmma::slab_offset<kBlockM>(r, c); };
  load_rows<T, D, kBlockM, kThreads, false>(q_s, a.q, b, h, m0, a.q_len, a.head_dim, tid, query_slabs);
  load_rows<T, D, kBlockM, kThreads, false>(do_s, g.d_o, b, h, m0, a.q_len, a.value_dim, tid, query_slabs);
  copy_commit();
  // Warp w owns rows m0 + 16 w .. + 15; this thread rows row0 and row0 + 8 (the accumulator layout).
  const int warp_row0 = m0 + warp * 16, row0 = warp_row0 + lane / 4;
  {
    int64_t lo, hi;
    warp_query_range<16>(a, warp_row0, lane, lo, hi);
    if (lane == 0) warp_q_lo[warp] = lo, warp_q_hi[warp] = hi;
  }
  // LSE in log2 units (+inf where the row saw nothing, so that its P is 0) and delta of this thread's rows.
  float lse_log2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    lse_log2[r] = INFINITY, delta[r] = 0.0f;
    if (row < a.q_len) {
      const int64_t at = (int64_t(b) * a.q_heads + h) * a.q_len + row;
      const float lse = g.lse[at];
      lse_log2[r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      delta[r] = g.delta[at];
    }
  }
  __syncthreads();
  int64_t block_q_lo = INT64_MAX, block_q_hi = INT64_MIN, group_q_lo = INT64_MAX, group_q_hi = INT64_MIN;
  for (int w = 0; w < kWarps; ++w) {
    block_q_lo = min(block_q_lo, warp_q_lo[w]), block_q_hi = max(block_q_hi, warp_q_hi[w]);
    if (w / 4 == group) group_q_lo = min(group_q_lo, warp_q_lo[w]), group_q_hi = max(group_q_hi, warp_q_hi[w]);
  }
  int first, last;
  block_visible_tiles<kBlockN, kBlockM, false>(a, b, m0, block_q_lo, block_q_hi, first, last);
  const int tiles = last - first + 1;  // <= 0: none (dQ adds nothing)
  // (Loops written out rather than in lambdas, and no early return: written so, the D = 256 instance spilled
  // more and ran 1.24x slower in the kernel lab.)
  // K and V tiles by TMA, started by one thread, each buffer's landing counted by its mbarrier.
  __shared__ alignas(8) uint64_t k_landed[2], v_landed[2];
  tma::Landings k_in{k_landed}, v_in{v_landed};
  wgmma::by_thread_zero(tid, [&] {
    k_in.init(2), v_in.init(2);
    tma::fence_barrier_init();
    if (tiles > 0) {
      tma::load_row_tile<kBlockN, D>(k_s, &maps.k, first * kBlockN, kh, b, &k_landed[0]);
      tma::load_row_tile<kBlockN, D>(v_s, &maps.v, first * kBlockN, kh, b, &v_landed[0]);
    }
  });

  float dq_low[Traits::kTilesLow][4], dq_high[Traits::kTilesHigh][4];
#pragma unroll
  for (int j = 0; j < Traits::kTilesLow; ++j) dq_low[j][0] = dq_low[j][1] = dq_low[j][2] = dq_low[j][3] = 0.0f;
#pragma unroll
  for (int j = 0; j < Traits::kTilesHigh; ++j) dq_high[j][0] = dq_high[j][1] = dq_high[j][2] = dq_high[j][3] = 0.0f;
  const float scale_log2 = a.scale * kLog2e;
  const uint32_t q_rows = smem_address(q_s) + group * 64 * kRowBytes;  // this warpgroup's 64 rows
  const uint32_t do_rows = smem_address(do_s) + group * 64 * kRowBytes;

  copy_wait_all();
  wgmma::fence_shared_writes();  // cp.async wrote Q and dO through the generic proxy; wgmma reads through the async one
  for (int i = 0; i < tiles; ++i) {
    const int tile = first + i;
    __syncthreads();  // (Q and dO are in;) step i - 1's products are done with the other buffers
    if (tid == 0 && i + 1 < tiles) {  // (a plain branch per step: see wgmma::by_thread_zero)
      tma::load_row_tile<kBlockN, D>(k_s + ((i + 1) % 2) * kBlockN * D, &maps.k, (tile + 1) * kBlockN, kh, b,
                                     &k_landed[(i + 1) % 2]);
      if constexpr (!Traits::kOneVBuffer)
        tma::load_row_tile<kBlockN, D>(v_s + ((i + 1) % 2) * kBlockN * D, &maps.v, (tile + 1) * kBlockN, kh, b,
                                       &v_landed[(i + 1) % 2]);
    }
    k_in.wait(i % 2);                            // K_i
    v_in.wait(Traits::kOneVBuffer ? 0 : i % 2);  // V_i
    const uint32_t k_tile = smem_address(k_s + (i % 2) * kBlockN * D);
    const uint32_t v_tile = smem_address(v_s + (Traits::kOneVBuffer ? 0 : i % 2) * kBlockN * D);
    float s[8][4], dp[8][4];
    wgmma::fence();
    rows_by_keys<T, D>(s, q_rows, k_tile);
    rows_by_keys<T, D>(dp, do_rows, v_tile);
    int64_t k_lo, k_hi;
    tile_key_range<kBlockN>(a, tile, lane, k_lo, k_hi);
    const BlockKind kind = classify_block(group_q_lo, group_q_hi, k_lo, k_hi, a.causal, a.window_left, a.window_right);
    const bool masked = kind != BlockKind::kFull || (tile + 1) * kBlockN > a.kv_len;
    // P against LSE (0 where a pair is hidden or past an end) while dP is computed.
    wgmma::wait<1>();
    wgmma::pin(s);
    if (masked) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = tile * kBlockN + j * 8 + (lane % 4) * 2 + (e & 1), row = row0 + 8 * (e / 2);
          const bool visible =
              key < a.kv_len && row < a.q_len &&
              position_visible(q_position(a.pos, row), k_position(a.pos, key), a.causal, a.window_left, a.window_right);
          s[j][e] = visible ? fast_exp2(fmaf(s[j][e], scale_log2, -lse_log2[e / 2])) : 0.0f;
        }
    } else {  // straight-line: no per-element branch in the common case
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = fast_exp2(fmaf(s[j][e], scale_log2, -lse_log2[e / 2]));
    }
    wgmma::wait<0>();
    wgmma::pin(dp);
    if constexpr (Traits::kOneVBuffer) {
      __syncthreads();  // both warpgroups are done with V_i: its buffer takes V_{i+1}
      if (tid == 0 && i + 1 < tiles)
        tma::load_row_tile<kBlockN, D>(v_s, &maps.v, (tile + 1) * kBlockN, kh, b, &v_landed[0]);
    }
    uint32_t ds[kBlockN / 16][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[j][e] = s[j][e] * (dp[j][e] - delta[e / 2]);
#pragma unroll
    for (int kc = 0; kc < kBlockN / 16; ++kc) pack_probabilities<T>(dp, kc, ds[kc]);
    // dQ += dS K: K is [keys][D], N-major here; 16 keys per k-step, column slabs kBlockN rows apart.
    wgmma::fence();
#pragma unroll
    for (int kc = 0; kc < kBlockN / 16; ++kc) {
      const uint32_t keys = k_tile + kc * 16 * kRowBytes;
      wgmma::mma_rs_tb<T>(dq_low, ds[kc], wgmma::sw128_desc(keys, kBlockN * kRowBytes, kSwizzleAtom));
      wgmma::mma_rs_tb<T>(dq_high, ds[kc], wgmma::sw128_desc(keys + 2 * kBlockN * kRowBytes, kBlockN * kRowBytes, kSwizzleAtom));
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::pin(dq_low);
    wgmma::pin(dq_high);
    wgmma::pin(ds);
  }
  // dQ times the scale into the accumulator, by 8-byte atomics: the only add to these rows in this call, but
  // another call on another stream may add there (the ring's). add_dq_rows' 16-byte form ran 4% slower here.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row >= a.q_len) continue;
    float* out = g.dq + ((int64_t(b) * a.q_len + row) * a.q_heads + h) * a.head_dim + (lane % 4) * 2;
#pragma unroll
    for (int j = 0; j < Traits::kTilesLow; ++j)
      atomicAdd(reinterpret_cast<float2*>(out + j * 8), make_float2(dq_low[j][2 * r] * a.scale, dq_low[j][2 * r + 1] * a.scale));
#pragma unroll
    for (int j = 0; j < Traits::kTilesHigh; ++j)
      atomicAdd(reinterpret_cast<float2*>(out + 128 + j * 8),
                make_float2(dq_high[j][2 * r] * a.scale, dq_high[j][2 * r + 1] * a.scale));
  }
#endif
}

}  // namespace ra::wgmma_dq

namespace ra {

// Instantiated once per dtype, each in a translation unit of its own (flash_wgmma_dq_bf16.cu, _f16.cu): with
// both dtypes' instances in one, cicc's code for the D = 256 kernel spills twice as much (264 bytes a thread
// against 128) and ran 1.24x slower.
template <typename T>
void launch_flash_wgmma_dq(const FlashBackwardArgs& g, cudaStream_t stream) {
  dispatch_head_dim<192, 256>(g.a.head_dim, "the wgmma backward's dQ kernel", [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    using Traits = wgmma_dq::DqKernelTraits<D>;
    auto kernel = wgmma_dq::flash_wgmma_dq_kernel<T, D>;
    RA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Traits::kSmemBytes)));
    const dim3 grid(unsigned((g.a.q_len + wgmma_dq::kBlockM - 1) / wgmma_dq::kBlockM), unsigned(g.a.q_heads),
                    unsigned(g.a.batch));
    kernel<<<grid, wgmma_dq::kThreads, Traits::kSmemBytes, stream>>>(g, key_tiles_of<T>(g.a, wgmma_dq::kBlockN));
    RA_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace ra
