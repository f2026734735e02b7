// FlashAttention-2 style forward on tensor cores. One block of 4 warps owns 128 query rows of one
// (batch, head); each warp owns 32 rows (two 16-row MMA tiles that share every K and V fragment;
// at head_dim 256 one tile, 64 rows per block, so that O fits in registers). K/V tiles of 64 keys stream through double-buffered shared
// memory (cp.async), S = Q K^T and O += P V run on mma.sync m16n8k16 with f32 accumulators, and P
// never leaves registers (the accumulator layout of S is the operand layout of P). With sorted key
// positions (every layout) the visible tiles are one interval found by binary search, so tiles no
// query can see are never loaded; tiles that every query of a warp sees take a path without
// per-element masking.
#include "attention/cuda/flash_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "attention/cuda/dispatch.cuh"
#include "attention/cuda/flash_tile.cuh"
#include "attention/cuda/flash_wgmma.h"
#include "attention/cuda/mma_sync.cuh"
#include "attention/cuda/segment_ranges.h"
#include "runtime/cuda_device.h"

namespace ra {
namespace {

using namespace flash;

constexpr int kWarps = 4, kThreads = kWarps * 32;
// 16-row MMA tiles per warp: two share every K and V fragment; at D = 256 the O accumulators of two
// (256 floats per thread) would spill.
template <int D>
constexpr int kMTilesFor = D > 128 ? 1 : 2;
template <int D>
constexpr int kBlockMFor = kWarps * 16 * kMTilesFor<D>;  // query rows per block
constexpr int kBlockN = 64;                               // keys per K/V tile

template <typename T, int D, bool kPadded>
__device__ __forceinline__ void load_tile(T* dst, const DeviceView4& src, int b, int kh, int row0, int rows_total,
                                          int cols, int tid) {
  load_rows<T, D, kBlockN, kThreads, kPadded>(dst, src, b, kh, row0, rows_total, cols, tid,
                                     [](int r, int c) { return swizzled<D>(r, c); });
}

// kSegments: an instance that skips key tiles by segment ids and compares them in masked tiles; the
// others compile without them. kExtras: every tile masked pair by pair with the soft cap, bias, mask and
// dropout (always with kSegments). kPadded: head dims narrower than D (dispatch_flash_instance), zero columns.
// kSoftCap: the scores capped into log2 units before the masks (with kSegments, not kExtras): the other
// instances compile as before.
// kDropout: dropout beside positions and segment ids (flash_takes_dropout_beside_positions, with kSegments), as the
// wgmma forward's instance takes it: each row's dropout key formed once, each two pairs' decisions from one
// finalizer (drop_keyed), O scaled by 1 / (1 - p) once at the end.
template <typename T, int D, bool kExtras, bool kSegments, bool kPadded, bool kSoftCap = false, bool kDropout = false>
__global__ void __launch_bounds__(kThreads, 1) flash_forward_kernel(const CudaAttentionArgs a) {
  static_assert(!kDropout || (kSegments && !kExtras && !kSoftCap), "dropout beside positions and segment ids");
  constexpr int kMTiles = kMTilesFor<D>, kBlockM = kBlockMFor<D>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);
  T* k_smem = q_smem + kBlockM * D;      // two buffers of kBlockN x D
  T* v_smem = k_smem + 2 * kBlockN * D;  // two buffers of kBlockN x D
  __shared__ int64_t warp_q_lo[kWarps], warp_q_hi[kWarps];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m0 = blockIdx.x * kBlockM, h = blockIdx.y, b = blockIdx.z;
  const int kh = h / (a.q_heads / a.kv_heads);
  constexpr int kTilesD = D / 8;

  // Q tile -> shared memory (read back as MMA operands on every K tile: registers are for O and S).
  load_rows<T, D, kBlockM, kThreads, kPadded>(q_smem, a.q, b, h, m0, a.q_len, a.head_dim, tid,
                                     [](int r, int c) { return swizzled<D>(r, c); });
  copy_commit();
  // This thread's rows: m-tile t, half i -> row m0 + warp * 32 + t * 16 + i * 8 + lane / 4.
  const int warp_row0 = m0 + warp * 16 * kMTiles;
  {
    int64_t lo, hi;
    warp_query_range<16 * kMTiles, Positions::kRead>(a, warp_row0, lane, lo, hi);
    if (lane == 0) warp_q_lo[warp] = lo, warp_q_hi[warp] = hi;
  }
  // kDropout: every row's dropout key, formed once for all its tiles (registers held across the tiles spill).
  __shared__ std::conditional_t<kDropout, uint32_t[kBlockM], char> drop_row_keys;
  if constexpr (kDropout) {
    for (int row = tid; row < kBlockM; row += kThreads) drop_row_keys[row] = dropout_folded_row_key_at(a, b, h, m0 + row);
  }
  __syncthreads();
  int64_t block_q_lo = INT64_MAX, block_q_hi = INT64_MIN;
  for (int w = 0; w < kWarps; ++w) block_q_lo = min(block_q_lo, warp_q_lo[w]), block_q_hi = max(block_q_hi, warp_q_hi[w]);
  const int64_t my_q_lo = warp_q_lo[warp], my_q_hi = warp_q_hi[warp];
  const bool warp_active = my_q_lo <= my_q_hi;  // false for warps wholly past q_len
  // Segment ids (ranges of 64-row chunks): tiles that share none with the block are never loaded.
  int2 block_seg{}, warp_seg{};
  if (kSegments && a.q_segment_ranges) {
    block_seg = segment_range(a.q_segment_ranges, a.q_len, b, m0, kBlockM);
    warp_seg = segment_range(a.q_segment_ranges, a.q_len, b, warp_row0, 16 * kMTiles);
  }

  // The carry in (the running max in log2 units inside the kernel).
  float o_acc[kMTiles][kTilesD][4];
  float m_row[kMTiles][2], l_row[kMTiles][2];
  const int64_t carry_row0 = (int64_t(b) * a.q_heads + h) * a.q_len;
#pragma unroll
  for (int t = 0; t < kMTiles; ++t)
    load_carry<kPadded>(a, carry_row0, warp_row0 + t * 16 + lane / 4, lane, o_acc[t], m_row[t], l_row[t]);
  // kDropout: kept pairs' P stay unscaled (drop_keyed), so O takes 1 / (1 - p) once at the end; the carry's O, scaled
  // by 1 - p here, comes back to within rounding.
  [[maybe_unused]] const float keep_scale = 1.0f / (1.0f - a.dropout_prob);
  [[maybe_unused]] auto scale_o = [&](float by) {
#pragma unroll
    for (int t = 0; t < kMTiles; ++t) scale_fragment(o_acc[t], by);
  };
  if constexpr (kDropout) scale_o(1.0f - a.dropout_prob);

  const float scale_log2 = a.scale * kLog2e;

  int first, last;
  block_visible_tiles<kBlockN, kBlockM, kSegments, Positions::kRead>(a, b, m0, block_q_lo, block_q_hi, first, last);
  first = next_segment_tile<kBlockN, kSegments>(a, b, block_seg, first, last, lane);
  if (first <= last) {
    load_tile<T, D, kPadded>(k_smem, a.k, b, kh, first * kBlockN, a.kv_len, a.head_dim, tid);
    load_tile<T, D, kPadded>(v_smem, a.v, b, kh, first * kBlockN, a.kv_len, a.value_dim, tid);
  }
  copy_commit();
  int64_t k_lo = 0, k_hi = 0;
  if (first <= last) tile_key_range<kBlockN, Positions::kRead>(a, first, lane, k_lo, k_hi);

  int buffer = 0;
  for (int tile = first; tile <= last;) {
    // The next tile and its key range, loaded now and used on the next iteration (their latency hides here).
    const int next = next_segment_tile<kBlockN, kSegments>(a, b, block_seg, tile + 1, last, lane);
    int64_t next_lo = 0, next_hi = 0;
    if (next <= last && a.pos.keys_sorted) tile_key_range<kBlockN, Positions::kRead>(a, next, lane, next_lo, next_hi);
    copy_wait_all();
    __syncthreads();  // this tile (and Q) visible to all; everyone is done with the other buffer
    if (next <= last) {
      T* k_next = k_smem + (1 - buffer) * kBlockN * D;
      T* v_next = v_smem + (1 - buffer) * kBlockN * D;
      load_tile<T, D, kPadded>(k_next, a.k, b, kh, next * kBlockN, a.kv_len, a.head_dim, tid);
      load_tile<T, D, kPadded>(v_next, a.v, b, kh, next * kBlockN, a.kv_len, a.value_dim, tid);
    }
    copy_commit();

    const int n0 = tile * kBlockN;
    const T* k_tile = k_smem + buffer * kBlockN * D;
    const T* v_tile = v_smem + buffer * kBlockN * D;
    BlockKind kind = warp_active ? classify_block(my_q_lo, my_q_hi, k_lo, k_hi, a.causal, a.window_left, a.window_right)
                                 : BlockKind::kSkip;
    if (kSegments && a.kv_segment_ranges)
      kind = with_segments(a, kind, warp_seg, segment_range(a.kv_segment_ranges, a.kv_len, b, n0, kBlockN));
    if (kind != BlockKind::kSkip) {
      // S = Q K^T for this warp's rows x 64 keys; each K fragment feeds every m-tile.
      float s[kMTiles][kBlockN / 8][4];
#pragma unroll
      for (int t = 0; t < kMTiles; ++t)
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) s[t][j][0] = s[t][j][1] = s[t][j][2] = s[t][j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qf[kMTiles][4];
#pragma unroll
        for (int t = 0; t < kMTiles; ++t) {
          const int mi = lane / 8, r = warp * 16 * kMTiles + t * 16 + (mi % 2) * 8 + lane % 8, c = kk * 2 + mi / 2;
          ldmatrix_x4(qf[t], q_smem + swizzled<D>(r, c));
        }
#pragma unroll
        for (int j = 0; j < kBlockN / 8; j += 2) {
          uint32_t kf[4];
          const int mi = lane / 8, r = (j + mi / 2) * 8 + lane % 8, c = kk * 2 + mi % 2;
          ldmatrix_x4(kf, k_tile + swizzled<D>(r, c));
#pragma unroll
          for (int t = 0; t < kMTiles; ++t) {
            mma_16816<T>(s[t][j], qf[t], kf[0], kf[1]);
            mma_16816<T>(s[t][j + 1], qf[t], kf[2], kf[3]);
          }
        }
      }
      // Unmasked tiles keep raw scores and fold the scale into the exponent's FFMA; masked tiles are
      // already in log2 units (-inf where hidden).
      const bool masked = kind == BlockKind::kPartial || kExtras || n0 + kBlockN > a.kv_len;
      const float sc = masked || kSoftCap ? 1.0f : scale_log2;
#pragma unroll
      for (int t = 0; t < kMTiles; ++t) {
        const int row0 = warp_row0 + t * 16 + lane / 4;
        // The soft cap, positions and segments, then the bias and mask tensors. Pair by pair (positions read):
        // the column limits of the wgmma extras instance cost this kernel 35% in spills at D = 128 (measured).
        if constexpr (kExtras) {
          float to_log2 = scale_log2;
          if (a.soft_cap > 0.0f) soft_cap_scores<true>(s[t], a.scale / a.soft_cap, a.soft_cap * kLog2e), to_log2 = 1.0f;
          mask_positions<kSegments>(a, s[t], b, n0, lane, row0, to_log2);
          add_bias_mask(a, s[t], b, h, n0, lane, row0, nullptr);
        } else {
          if constexpr (kSoftCap) soft_cap_scores<true>(s[t], a.scale / a.soft_cap, a.soft_cap * kLog2e);
          // no TileKeys: 6-22% slower here (spills)
          if (masked) mask_positions<kSegments>(a, s[t], b, n0, lane, row0, kSoftCap ? 1.0f : scale_log2);
        }
        softmax_step(s[t], o_acc[t], m_row[t], l_row[t], sc);
        if (kExtras && a.dropout_prob > 0.0f) drop_probabilities(a, s[t], b, h, n0, lane, row0, nullptr);
        if constexpr (kDropout) {  // keys in one run take drop_keyed's stepped words; others are read
          const uint32_t row_folded[2] = {drop_row_keys[row0 - m0], drop_row_keys[row0 + 8 - m0]};
          const TileKeys keys = run_tile_keys(a, n0);
          drop_keyed(a, s[t], row_folded, n0, lane, &keys);
        }
      }
      // O += P V: P from the S accumulators, V through a transposing ldmatrix that feeds both m-tiles.
#pragma unroll
      for (int kc = 0; kc < kBlockN / 16; ++kc) {
        uint32_t pf[kMTiles][4];
#pragma unroll
        for (int t = 0; t < kMTiles; ++t) pack_probabilities<T>(s[t], kc, pf[t]);
#pragma unroll
        for (int j = 0; j < kTilesD; j += 2) {
          uint32_t vf[4];
          const int mi = lane / 8, r = kc * 16 + (mi % 2) * 8 + lane % 8, c = j + mi / 2;
          ldmatrix_x4_trans(vf, v_tile + swizzled<D>(r, c));
#pragma unroll
          for (int t = 0; t < kMTiles; ++t) {
            mma_16816<T>(o_acc[t][j], pf[t], vf[0], vf[1]);
            mma_16816<T>(o_acc[t][j + 1], pf[t], vf[2], vf[3]);
          }
        }
      }
    }
    if (next <= last) {
      if (a.pos.keys_sorted) k_lo = next_lo, k_hi = next_hi;
      else tile_key_range<kBlockN, Positions::kRead>(a, next, lane, k_lo, k_hi);
    }
    buffer = 1 - buffer;
    tile = next;
  }
  copy_wait_all();
  if constexpr (kDropout) scale_o(keep_scale);

  // The carry out.
#pragma unroll
  for (int t = 0; t < kMTiles; ++t)
    store_carry<kPadded>(a, carry_row0, warp_row0 + t * 16 + lane / 4, lane, o_acc[t], m_row[t], l_row[t]);
}

template <typename T, int D, bool kPadded>
void launch(const CudaAttentionArgs& a, cudaStream_t stream) {
  constexpr int kBlockM = kBlockMFor<D>;
  const size_t smem = size_t(kBlockM + 4 * kBlockN) * D * sizeof(T);
  // The extras and soft-cap instances always read segment ids (the extras compare every logit anyway; the
  // soft cap is rare enough not to double its instances).
  auto kernel = flash_takes_dropout_beside_positions(a) ? flash_forward_kernel<T, D, false, true, kPadded, false, true>
                : flash_has_extras(a)   ? flash_forward_kernel<T, D, true, true, kPadded>
                : a.soft_cap > 0.0f  ? flash_forward_kernel<T, D, false, true, kPadded, true>
                : a.q_segment_ranges ? flash_forward_kernel<T, D, false, true, kPadded>
                                     : flash_forward_kernel<T, D, false, false, kPadded>;
  RA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((a.q_len + kBlockM - 1) / kBlockM), unsigned(a.q_heads), unsigned(a.batch));
  kernel<<<grid, kThreads, smem, stream>>>(a);
  RA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void check_flash_cuda_supported(const AttentionInputs& in) {
  const DType dt = in.q.dtype();
  RA_CHECK(dt == DType::kF16 || dt == DType::kBF16, "q has dtype ", dtype_name(dt),
           ": the cuda flash_attn2 kernel takes f16 or bf16 (tensor cores); use --impl sdpa for f32 on cuda");
  for (auto [t, name] : {std::pair{&in.k, "k"}, std::pair{&in.v, "v"}})
    RA_CHECK(t->dtype() == dt, name, " has dtype ", dtype_name(t->dtype()), ", expected q's ", dtype_name(dt));
  check_flash_head_dims(in.q.dim(3), in.v.dim(3), "the cuda flash_attn2 kernel");
  for (auto [t, name] : {std::pair{&in.q, "q"}, std::pair{&in.k, "k"}, std::pair{&in.v, "v"}}) {
    const bool aligned = t->stride(3) == 1 && t->stride(1) % 8 == 0 && t->stride(0) % 8 == 0 && t->stride(2) % 8 == 0 &&
                         reinterpret_cast<uintptr_t>(t->data()) % 16 == 0;
    RA_CHECK(aligned, name, " must have a contiguous last dimension and 16-byte aligned rows for the cuda "
             "flash_attn2 kernel (strides ", t->stride(0), ", ", t->stride(1), ", ", t->stride(2), ", ", t->stride(3), ")");
  }
}

void check_flash_head_dims(int64_t head_dim, int64_t value_dim, const char* kernel) {
  auto fits = [](int64_t d) { return d > 0 && d <= 256 && d % 8 == 0; };
  RA_CHECK(fits(head_dim) && fits(value_dim), "q dimension 3 (head_dim) is ", head_dim, " and v dimension 3 is ",
           value_dim, ": ", kernel, " takes head dims that are multiples of 8 up to 256; use --impl sdpa (any)");
}

bool flash_has_extras(const CudaAttentionArgs& a) { return a.bias.data || a.mask.data || a.dropout_prob > 0.0f; }

bool flash_uses_wgmma(const CudaAttentionArgs& a) {
  const FlashKernel k = a.flash_kernel;
  if (k == FlashKernel::kMmaSync) return false;
  const bool available = flash_wgmma_available();
  RA_CHECK(available || k != FlashKernel::kWgmma, "the wgmma flash_attn2 kernels were asked for (flash_kernel wgmma) but "
           "this build has no sm_90a code for it or the GPU is not a Hopper (build with -DCMAKE_CUDA_ARCHITECTURES=90a)");
  return available;
}

void flash_accumulate_cuda(const CudaAttentionArgs& args, DType dtype, cudaStream_t stream) {
  if (args.q_len == 0 || args.kv_len == 0) return;
  CudaAttentionArgs a = args;
  const SegmentRanges segments(a, stream);
  find_dropout_key_pairing(a);
  if (flash_uses_wgmma(a)) return flash_wgmma_accumulate(a, dtype, stream);
  dispatch_half_dtype(dtype, "the cuda flash_attn2 kernel", [&](auto element) {
    // Exact head dims of 64 and 128 run the padded instance, measured 1.04x / 1.01x the exact ones; at 256 the
    // exact one is 1.14-1.21x faster (H100, T = 32768, bf16: bench/RESULTS.md).
    dispatch_flash_instance<256>(a.head_dim, a.value_dim, "the cuda flash_attn2 kernel", [&](auto instance, auto padded) {
      launch<decltype(element), decltype(instance)::value, decltype(padded)::value>(a, stream);
    });
  });
}

}  // namespace ra
