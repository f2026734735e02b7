// The wgmma flash backward kernel and its traits (see flash_wgmma_backward.cu), in a header so that the
// default instances (flash_wgmma_backward.cu) and the ordered ones of --deterministic
// (flash_wgmma_backward_ordered.cu) compile as two translation units, in parallel.
#pragma once

#include <type_traits>

#include "attention/cuda/bias_tile.cuh"
#include "attention/cuda/flash_backward_rows.cuh"
#include "attention/cuda/flash_cuda.h"
#include "attention/cuda/mask_tile.cuh"
#include "attention/cuda/tensor_map.h"
#include "attention/cuda/tma.cuh"
#include "attention/cuda/tma_store.cuh"
#include "attention/cuda/wgmma.cuh"

namespace ra::wgmma_backward {

using namespace flash;

constexpr int kGroups = 2, kThreads = kGroups * 128;  // warpgroups per block
using wgmma::kRowBytes;
using wgmma::kSwizzleAtom;

// kExtras: the extras instance, whose per-pair work needs registers the unsplit D = 128 kernel spends on
// dK and dV: it splits too (measured faster there). kBias, kMask: the bias and mask instances, one more tile in
// shared memory.
template <typename T, int D, bool kExtras = false, bool kBias = false, bool kMask = false>
struct WgmmaBackwardTraits {
  // D > 128: the two warpgroups share 64 keys and split the query block (S^T, dP^T) and D (dK, dV, dQ).
  static constexpr bool kSplit = D > 128 || (kExtras && D == 128);
  static constexpr int kBlockN = kSplit ? 64 : kGroups * 64;  // keys per block
  // Query rows per step: dK and dV (64 keys x D per warpgroup) and S^T, dP^T (64 keys x kBlockM) share
  // a thread's 255 registers, so D = 96 and 128 take 64 rows and D <= 64 takes 128; D > 128 (split) 64.
  static constexpr int kBlockM = D <= 64 ? 128 : 64;
  // A step's dQ is kBlockM x D; each warpgroup forms part: half the rows (D <= 64) or a share of D.
  static constexpr bool kDqSplitsRows = kBlockM == 128;
  static constexpr int kTilesD = D / 8 / (kSplit ? 2 : 1);       // dK / dV columns per warpgroup, in 8s
  static constexpr int kTilesM = kBlockM / 8 / (kSplit ? 2 : 1);  // S^T's query columns per warpgroup
  // Q, dO, K and V in slabs of 64 columns (128-byte swizzle) where each warpgroup's share of D starts on
  // one; else of 32 (D = 32, 96, 192: 64-byte swizzle), as an MN-major operand covers whole slabs.
  static constexpr int kSwizzleBytes = D % 128 == 0 || D == 64 ? 128 : 64;
  using DSlabs = wgmma::Slabs<kSwizzleBytes>;
  // dQ's columns per warpgroup, in 8s: where the warpgroups split D, half of it rounded up to whole slabs.
  // D = 96: 64 columns each (the second warpgroup's last 32 are products with V's first slab, which
  // follows K's, and never stored: a branch to a narrower wgmma there would serialise every wgmma).
  static constexpr int kSlabTiles = DSlabs::kCols / 8;
  static constexpr int kTilesDq = kDqSplitsRows ? D / 8 : (D / 16 + kSlabTiles - 1) / kSlabTiles * kSlabTiles;
  static constexpr bool kDqPastD = !kDqSplitsRows && 2 * kTilesDq * 8 > D;  // columns formed past D (never stored)
  // K and V, two buffers each of Q and dO, dS^T (and P^T where split); + slack to start the tiles on the
  // swizzle's 1024 bytes.
  // The bias instance's tile (rows of queries): 4 floats past kBlockN a row, so that a fragment's four query
  // rows two apart and eight keys in a row fall into 32 different banks.
  static constexpr int kBiasStride = kBlockN + 4;
  // The bias instance's tile follows them (16-byte aligned: every count above is a multiple of 8).
  static constexpr size_t kBiasOffset =
      size_t(2 * kBlockN * D + 4 * kBlockM * D + (kSplit ? 2 : 1) * kBlockN * kBlockM);
  // The mask instance's tile (rows of queries, a byte a key) in its place: rows 16 bytes past kBlockN, so that a
  // fragment's four query rows two apart fall into different banks.
  static constexpr int kMaskStride = flash::kMaskStride<kBlockN>;
  static constexpr size_t kSmemBytes = kBiasOffset * sizeof(T) +
                                       (kBias ? size_t(kBlockM) * kBiasStride * sizeof(float) : 0) +
                                       (kMask ? size_t(kBlockM) * kMaskStride : 0) + kSwizzleAtom;
  static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 192 || D == 256,
                "dK and dV of 64 keys x D (x D / 2 where split) per warpgroup in registers");
  static_assert(kTilesD % kSlabTiles == 0 && kTilesDq % kSlabTiles == 0, "every share of D in whole slabs");
  static_assert(kTilesD <= 16 && kTilesDq <= 16 && (kTilesM == 4 || kTilesM == 8 || kTilesM == 16), "wgmma's N <= 128");
  static_assert(kBlockM == 64 || !kSplit, "dS^T and P^T rows of one 64-query slab");
  static_assert(kDqSplitsRows == (D <= 64) && kBlockM % 64 == 0, "dQ: each warpgroup 64 rows x its columns");
  static_assert(kSmemBytes <= 227 * 1024, "one block's shared memory on an sm_90 SM");
};

// g with the TMA maps of q and d_o that an instance with these traits loads its steps by: boxes of kBlockM
// rows x one slab of columns, swizzled as the slabs (the flash kernels' checks guarantee 16-byte rows).
template <typename T, typename Traits>
FlashBackwardArgs with_step_maps(const FlashBackwardArgs& g) {
  using Slabs = typename Traits::DSlabs;
  const CudaAttentionArgs& a = g.a;
  FlashBackwardArgs with = g;
  with.q_map = row_tiles_of("q", a.q, tile_element_of<T>(), a.batch, a.q_len, a.q_heads, a.head_dim, Traits::kBlockM,
                            Slabs::kCols, int(Slabs::kRowBytes));
  with.do_map = row_tiles_of("do", g.d_o, tile_element_of<T>(), a.batch, a.q_len, a.q_heads, a.value_dim,
                             Traits::kBlockM, Slabs::kCols, int(Slabs::kRowBytes));
  // A single call's dK and dV (contiguous as k and v, 16-byte aligned: CudaAttentionImpl::writes_into_views), stored by
  // a block's kBlockN keys as its K and V loaded; by per-thread stores where TMA cannot address them.
  if (g.dk_direct != nullptr) {
    auto encode = [&](CUtensorMap& map, const void* data, int cols) {
      const int64_t row = int64_t(a.kv_heads) * cols;
      const DeviceView4 view{data, {a.kv_len * row, row, cols, 1}};
      return encode_row_tiles(map, view, tile_element_of<T>(), a.batch, a.kv_len, a.kv_heads, cols, Traits::kBlockN,
                              Slabs::kCols, int(Slabs::kRowBytes));
    };
    with.dk_dv_by_tma = encode(with.dk_map, g.dk_direct, a.head_dim) && encode(with.dv_map, g.dv_direct, a.value_dim);
  }
  return with;
}

// A warpgroup's fragment of kTiles x 8 columns from col0 (rows row and row + 8 of this thread; the accumulator layout)
// times scale, as T, into a tile of kRows rows laid out in Slabs' swizzled slabs.
template <typename T, int kRows, typename Slabs, int kTiles>
__device__ __forceinline__ void stage_fragment_rows(T* tile, const float (&frag)[kTiles][4], float scale, int row,
                                                    int col0, int lane) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<uint32_t*>(tile + Slabs::template offset<kRows>(row + 8 * half, col0 / 8 + j) +
                                   (lane % 4) * 2) = pack2<T>(frag[j][2 * half] * scale, frag[j][2 * half + 1] * scale);
}

// kSegments: an instance that reads segment ids (skipping query blocks, comparing ids in masked steps);
// the other compiles without them, as it did before (this kernel spills at any extra live value).
// kSoftCap: an instance with a soft cap (with kSegments or without): P from the capped logits, and dS times
// the cap's derivative 1 - tanh^2, tanh recovered from P and LSE rather than kept (no live value more).
// kExtras: an instance that forms every pair with the soft cap (at run time), the bias and mask tensors
// and dropout, and adds dS into dBias by atomics (flash_has_extras; always with kSegments).
// kPadded: head dims narrower than D (dispatch_flash_instance): zero columns loaded, never stored.
// kOrdered: --deterministic (flash_wgmma_backward_ordered.cu): the key blocks run from the last down, and each
// adds its dQ into a block of query rows on its turn (DqTurn), after every key block above it that adds there.
// kDqApart: dK and dV only; flash_wgmma_dq_kernel.cuh forms dQ (flash_wgmma_backward_dq.cu).
// kBias: an additive bias (flash_takes_bias_instance), each step's bias tile staged in shared memory while the step
// before it ends, dS added into dBias by atomics; positions masked as without it.
// kMask: a boolean mask (flash_takes_mask_instance), staged the same way, a byte a pair.
// kDropout: dropout beside positions and segment ids (flash_takes_dropout_beside_positions), or beside kBias or kMask:
// each step's rows' dropout keys formed once into shared memory beside their LSE, each pair's decision from its row's
// key and its key's position.
template <typename T, int D, bool kSegments, bool kSoftCap, bool kExtras, bool kPadded, bool kOrdered = false,
          bool kDqApart = false, bool kBias = false, bool kMask = false, bool kDropout = false>
__global__ void __launch_bounds__(kThreads, 1) flash_wgmma_backward_kernel(const __grid_constant__ FlashBackwardArgs g) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!(kBias || kMask) || !(kSegments || kSoftCap || kExtras || kOrdered || kDqApart || (kBias && kMask)),
                "the bias or the mask alone");
  static_assert(!kDropout || !(kSoftCap || kExtras || kOrdered || kDqApart),
                "dropout beside positions and segment ids, or a bias or mask");
  using Traits = WgmmaBackwardTraits<T, D, kExtras, kBias, kMask>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kTilesD = Traits::kTilesD;
  constexpr int kTilesM = Traits::kTilesM, kTilesDq = Traits::kTilesDq;
  static_assert(kPadded || !Traits::kDqPastD, "dQ's columns past D are left out by the padded instances' bounds");
  using DSlabs = typename Traits::DSlabs;  // Q, dO, K, V; dS^T and P^T (64 query columns) in 128-byte rows
  constexpr uint32_t kDRowBytes = DSlabs::kRowBytes;
  constexpr int kBiasStride = Traits::kBiasStride;
  const CudaAttentionArgs& a = g.a;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = wgmma::align_to_swizzle_atom(smem_raw);
  T* k_s = reinterpret_cast<T*>(smem);
  T* v_s = k_s + kBlockN * D;
  T* q_buffers = v_s + kBlockN * D;             // two buffers of kBlockM x D
  T* do_buffers = q_buffers + 2 * kBlockM * D;  // two buffers of kBlockM x D
  T* ds_s = do_buffers + 2 * kBlockM * D;       // dS^T: rows of keys, slabs of 64 queries
  T* p_s = ds_s + kBlockN * kBlockM;            // P^T likewise (kSplit only)
  [[maybe_unused]] float* bias_s = reinterpret_cast<float*>(reinterpret_cast<T*>(smem) + Traits::kBiasOffset);  // kBias
  [[maybe_unused]] uint8_t* mask_s = reinterpret_cast<uint8_t*>(reinterpret_cast<T*>(smem) + Traits::kBiasOffset);  // kMask
  constexpr int kMaskStride = Traits::kMaskStride;
  // Per step's rows: LSE in log2 units (+inf where the row saw nothing, so that its P is 0) and delta.
  __shared__ float lse_buffers[2][kBlockM], delta_buffers[2][kBlockM];
  __shared__ int32_t segment_buffers[2][kBlockM];  // the step's query segment ids (with segment ids only)
  // kMask: whether the mask keeps every pair of the step (its tile neither staged nor read), per buffer, written by
  // thread 0 where the step is found (a register held across the step spilled the kernel further).
  __shared__ bool mask_all_buffers[2];
  // kDropout: per step's rows, their dropout keys (dropout_row_key).
  __shared__ std::conditional_t<kDropout, uint32_t[2][kBlockM], char> drop_key_buffers;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, group = warp / 4;
  const int block = kOrdered ? int(gridDim.x) - 1 - int(blockIdx.x) : key_block(g), n0 = block * kBlockN;
  const int kh = blockIdx.y, b = blockIdx.z;
  // This warpgroup's keys (its own 64, or the 64 both share), this thread's two of them (key_row and
  // key_row + 8), and where split its query columns of S^T and its columns of dK / dV.
  const int key0 = Traits::kSplit ? 0 : group * 64, key_row = key0 + (warp % 4) * 16 + lane / 4;
  const int q_col0 = Traits::kSplit ? group * kTilesM * 8 : 0, d_col0 = Traits::kSplit ? group * kTilesD * 8 : 0;
  auto key_slabs = [](int r, int c) { return DSlabs::template offset<kBlockN>(r, c); };

  load_rows<T, D, kBlockN, kThreads, kPadded>(k_s, a.k, b, kh, n0, a.kv_len, a.head_dim, tid, key_slabs);
  load_rows<T, D, kBlockN, kThreads, kPadded>(v_s, a.v, b, kh, n0, a.kv_len, a.value_dim, tid, key_slabs);
  copy_commit();
  int64_t k_lo, k_hi;
  tile_key_range<kBlockN>(a, block, lane, k_lo, k_hi);
  const QueryWindow window = query_window<kBlockN, kSegments>(a, b, n0);
  // This thread's two keys (read by masked steps only); a key past the end is never visible.
  const bool key_in[2] = {n0 + key_row < a.kv_len, n0 + key_row + 8 < a.kv_len};
  const int64_t key_pos[2] = {key_in[0] ? k_position(a.pos, n0 + key_row) : 0,
                              key_in[1] ? k_position(a.pos, n0 + key_row + 8) : 0};
  // kBias / kMask: a step's tile of the bias or the mask, its rows of queries (committed by the caller); none where
  // the mask keeps every pair of it.
  auto load_staged = [&](int h, int m0, bool all_kept) {
    if constexpr (kBias) load_bias_tile<kBlockM, kBlockN, kBiasStride, kThreads>(bias_s, a, b, h, m0, n0, tid);
    if constexpr (kMask) {
      if (!all_kept) load_mask_tile<kBlockM, kBlockN, kMaskStride, kThreads>(mask_s, a, b, h, m0, n0, tid);
    }
  };
  // kMask: this key block's column of the mask's summary (MaskColumn), where the call has one that fits.
  __shared__ std::conditional_t<kMask, MaskColumn, char> mask_column;
  [[maybe_unused]] const bool column_walk =
      kMask && a.mask_tiles.states != nullptr && a.mask_tiles.row_chunks <= kMaskColumnChunks;
  // From (h, m0) on, the next step that sees these keys (next_visible_step); kMask: past the steps whose rows the
  // mask hides the whole block from (straight to the column's first chunk that keeps a pair, on to the next head
  // after its last), and whether it keeps every pair of the step (all_kept). Called by every thread (the walk is
  // the block's): a head with a mask of its own fills the column between two barriers.
  auto find_step = [&](int& step_h, int& step_m0, BlockKind& step_kind, bool& all_kept) {
    bool found = next_visible_step<kBlockM, kBlockN, kSegments>(a, b, kh, n0, k_lo, k_hi, window, lane, step_h, step_m0, step_kind);
    all_kept = false;
    if constexpr (kMask) {
      static_assert(kBlockN == kMaskTileKeys && kBlockM % kMaskChunkRows == 0, "tiles of the mask's summary");
      while (found && column_walk) {
        const int map = mask_tiles_map(a.mask_tiles, b, step_h);
        if (map != mask_column.map) {
          __syncthreads();  // every thread is done with the last head's column
          fill_mask_column<kThreads>(mask_column, a.mask_tiles, map, block, tid);
          __syncthreads();
        }
        if (step_m0 + kBlockM <= mask_column.rows_first) {
          step_m0 = mask_column.rows_first / kBlockM * kBlockM;
        } else if (step_m0 >= mask_column.rows_end) {
          ++step_h, step_m0 = 0;
        } else {
          const uint8_t state = rows_state<kBlockM>(mask_column.states, a.mask_tiles.row_chunks, step_m0);
          if (state) {
            all_kept = state & kMaskTileAll;
            break;
          }
          step_m0 += kBlockM;
        }
        found = next_visible_step<kBlockM, kBlockN, kSegments>(a, b, kh, n0, k_lo, k_hi, window, lane, step_h, step_m0, step_kind);
      }
    }
    return found;
  };

  float dk[kTilesD][4], dv[kTilesD][4];
#pragma unroll
  for (int j = 0; j < kTilesD; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;
  // Raw scores times this are log2-unit logits; with a soft cap the scores are capped into those units first.
  const bool soft_cap = kSoftCap || (kExtras && a.soft_cap > 0.0f);
  const float scale_log2 = soft_cap ? 1.0f : a.scale * kLog2e;

  // A step's Q and dO come by TMA (g.q_map, g.do_map: with_step_maps), started by one thread, each buffer's
  // landing counted by its mbarrier: per-thread copies cost this register-bound kernel 1.08-1.16x (the lab).
  __shared__ alignas(8) uint64_t step_landed[2];
  tma::Landings step_in{step_landed};
  wgmma::by_thread_zero(tid, [&] {
    step_in.init(2);
    tma::fence_barrier_init();
  });
  auto load_step = [&](int buffer, int h, int m0) {
    if (tid == 0) {  // (a plain branch per step: see wgmma::by_thread_zero)
      tma::arrive_expect_bytes(&step_landed[buffer], uint32_t(2 * kBlockM * D * sizeof(T)));  // Q's and dO's
      tma::load_row_slabs<kBlockM, D, DSlabs::kCols>(q_buffers + buffer * kBlockM * D, &g.q_map, m0, h, b, &step_landed[buffer]);
      tma::load_row_slabs<kBlockM, D, DSlabs::kCols>(do_buffers + buffer * kBlockM * D, &g.do_map, m0, h, b, &step_landed[buffer]);
    }
    load_step_segments<kBlockM, kSegments>(a, segment_buffers[buffer], b, m0, tid);
  };
  // A step's LSE and delta, read into registers when its loads start and stored when the step before
  // it ends (rows past the end read 0: their Q and dO rows are zeros, so they add nothing).
  auto read_stats = [&](int h, int m0, float& lse_log2, float& delta) {
    lse_log2 = delta = 0.0f;
    if (tid < kBlockM && m0 + tid < a.q_len) {
      const int64_t at = (int64_t(b) * a.q_heads + h) * a.q_len + m0 + tid;
      const float lse = g.lse[at];
      lse_log2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
      delta = g.delta[at];
    }
  };

  // kDropout: a step's rows' dropout keys into their buffer (read after the next step's first barrier; the buffer's
  // last readers, the step before, are past this one's).
  auto store_drop_keys = [&](int into, int h, int m0) {
    if constexpr (kDropout) {
      if (tid < kBlockM)
        drop_key_buffers[into][tid] = dropout_folded_row_key_at(a, b, h, m0 + tid);
    }
  };
  int h = kh * (a.q_heads / a.kv_heads), m0 = 0, buffer = 0;
  BlockKind kind = BlockKind::kSkip;
  bool first_all = false;
  if constexpr (kMask) {
    if (column_walk) fill_mask_column<kThreads>(mask_column, a.mask_tiles, mask_tiles_map(a.mask_tiles, b, h), block, tid);
    __syncthreads();
  }
  bool have = find_step(h, m0, kind, first_all);
  if (kMask && tid == 0) mask_all_buffers[0] = first_all;
  if (have) {
    load_step(0, h, m0);
    load_staged(h, m0, first_all);
    float lse_log2, delta;
    read_stats(h, m0, lse_log2, delta);
    if (tid < kBlockM) lse_buffers[0][tid] = lse_log2, delta_buffers[0][tid] = delta;
    store_drop_keys(0, h, m0);
  }
  copy_commit();
  // This warpgroup's 64 rows of K and V (A of S^T and dP^T), and dQ's operands: dS's query slab and K's
  // column slabs from this warpgroup's first column of dQ, MN-major (their slabs kBlockN rows apart).
  const uint32_t k_addr = smem_address(k_s), ds_addr = smem_address(ds_s);
  const uint64_t k_desc = DSlabs::desc(k_addr + key0 * kDRowBytes, 16, DSlabs::kAtomBytes);
  const uint64_t v_desc = DSlabs::desc(smem_address(v_s) + key0 * kDRowBytes, 16, DSlabs::kAtomBytes);
  const uint64_t ds_desc = wgmma::sw128_desc(ds_addr + (Traits::kDqSplitsRows ? group : 0) * kBlockN * kRowBytes,
                                             kBlockN * kRowBytes, kSwizzleAtom);
  const uint64_t dq_k_desc = DSlabs::desc(
      k_addr + (Traits::kDqSplitsRows ? 0 : group * kTilesDq * 8 / DSlabs::kCols) * kBlockN * kDRowBytes,
      kBlockN * kDRowBytes, DSlabs::kAtomBytes);
  [[maybe_unused]] DqTurn turn, passed;  // kOrdered, thread 0: this step's turn; the last step's, to hand on
  while (have) {
    int next_h = h, next_m0 = m0 + kBlockM;
    BlockKind next_kind = BlockKind::kSkip;
    bool next = false;
    float next_lse = 0.0f, next_delta = 0.0f;
    // The next step: found (its positions read), its loads started.
    auto prefetch_next = [&] {
      bool next_all;
      next = find_step(next_h, next_m0, next_kind, next_all);
      if (kMask && tid == 0) mask_all_buffers[1 - buffer] = next_all;  // read after the step's barrier before dQ
      if (next) {
        load_step(1 - buffer, next_h, next_m0);
        read_stats(next_h, next_m0, next_lse, next_delta);
        store_drop_keys(1 - buffer, next_h, next_m0);
      }
      copy_commit();
    };
    copy_wait_all();
    wgmma::fence_shared_writes();  // cp.async (K, V) wrote through the generic proxy; wgmma reads through the async one
    __syncthreads();  // this step's tiles and stats are in; the last step's products are done with the other buffers and dS^T
    step_in.wait(buffer);  // this step's Q and dO
    if constexpr (kOrdered) {  // the last step's dQ adds are all issued: its turn passes on
      if (tid == 0 && passed.counter) pass_dq_turn(passed);
    }
    const uint32_t q_addr = smem_address(q_buffers + buffer * kBlockM * D);
    const uint32_t do_addr = smem_address(do_buffers + buffer * kBlockM * D);
    const float* lse_s = lse_buffers[buffer];
    const float* delta_s = delta_buffers[buffer];

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys (and its query columns), both operands
    // K-major (rows of D): k-step kk is 32 bytes into slab kk / kKSteps.
    float st[kTilesM][4], dpt[kTilesM][4];
    const uint64_t q_desc = DSlabs::desc(q_addr + q_col0 * kDRowBytes, 16, DSlabs::kAtomBytes);
    const uint64_t do_desc = DSlabs::desc(do_addr + q_col0 * kDRowBytes, 16, DSlabs::kAtomBytes);
    constexpr int kKSteps = DSlabs::kKSteps;
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma::mma_ss<T, kTilesM>(st, wgmma::advance(k_desc, (kk / kKSteps) * kBlockN * kDRowBytes + (kk % kKSteps) * 32),
                                wgmma::advance(q_desc, (kk / kKSteps) * kBlockM * kDRowBytes + (kk % kKSteps) * 32), kk > 0);
    wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma::mma_ss<T, kTilesM>(dpt, wgmma::advance(v_desc, (kk / kKSteps) * kBlockN * kDRowBytes + (kk % kKSteps) * 32),
                                wgmma::advance(do_desc, (kk / kKSteps) * kBlockM * kDRowBytes + (kk % kKSteps) * 32), kk > 0);
    wgmma::commit();
    prefetch_next();  // the positions' reads wait while the tensor cores work
    if constexpr (kOrdered) {
      if (tid == 0) turn = peek_dq_turn(g, b, kh, h, m0 / kBlockM, block);
    }

    // P^T against LSE (0 where a pair is hidden or past an end) while dP^T is computed.
    const bool mask_all = kMask && mask_all_buffers[buffer];
    const bool masked = kind == BlockKind::kPartial || n0 + kBlockN > a.kv_len || m0 + kBlockM > a.q_len;
    wgmma::wait<1>();
    wgmma::pin(st);
    if (soft_cap) soft_cap_scores<false>(st, a.scale / a.soft_cap, a.soft_cap * kLog2e);
    // The extras instance masks every step; the mask tensor hides, the bias joins the exponent. Masked
    // steps of consecutive queries compare columns with each key's seeing ones (step_columns).
    [[maybe_unused]] StepColumns step;  // (the extras instance's dropout reads it again below)
    // What joins a pair's scaled score in the exponent: -LSE, and the bias instance's bias from its tile, or
    // -inf where the mask instance's tile hides the pair (this thread's pairs: four rows two apart and eight
    // keys in a row per wgmma fragment, conflict-free).
    auto exponent_offset = [&](int j, int e) {
      const int qcol = q_col0 + j * 8 + (lane % 4) * 2 + (e & 1);
      if constexpr (kBias)
        return fmaf(bias_s[qcol * kBiasStride + key_row + 8 * (e / 2)], kLog2e, -lse_s[qcol]);
      else if constexpr (kMask)
        return mask_all || mask_s[qcol * kMaskStride + key_row + 8 * (e / 2)] ? -lse_s[qcol] : -INFINITY;
      else
        return -lse_s[qcol];
    };
    if constexpr (kExtras) {
      step = step_columns<kBlockM>(a, m0, key_in, key_pos);
#pragma unroll
      for (int j = 0; j < kTilesM; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qcol = q_col0 + j * 8 + (lane % 4) * 2 + (e & 1), query = m0 + qcol;
          bool visible = step.consecutive ? step.sees(qcol, e / 2)
                                          : key_in[e / 2] && query < a.q_len &&
                                                position_visible(q_position(a.pos, query), key_pos[e / 2], a.causal,
                                                                 a.window_left, a.window_right);
          float bias = 0.0f;
          visible = visible && same_segment<kSegments>(a, segment_buffers[buffer], qcol, b, n0 + key_row + 8 * (e / 2)) &&
                    pair_bias_mask(a, b, h, query, key_pos[e / 2], bias);
          st[j][e] = visible ? fast_exp2(fmaf(st[j][e], scale_log2, fmaf(bias, kLog2e, -lse_s[qcol]))) : 0.0f;
        }
    } else if (masked) {
      const StepColumns cols = step_columns<kBlockM>(a, m0, key_in, key_pos);
#pragma unroll
      for (int j = 0; j < kTilesM; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qcol = q_col0 + j * 8 + (lane % 4) * 2 + (e & 1), query = m0 + qcol;
          const bool visible = (cols.consecutive ? cols.sees(qcol, e / 2)
                                                 : key_in[e / 2] && query < a.q_len &&
                                                       position_visible(q_position(a.pos, query), key_pos[e / 2],
                                                                        a.causal, a.window_left, a.window_right)) &&
                               same_segment<kSegments>(a, segment_buffers[buffer], qcol, b, n0 + key_row + 8 * (e / 2));
          st[j][e] = visible ? fast_exp2(fmaf(st[j][e], scale_log2, exponent_offset(j, e))) : 0.0f;
        }
    } else if (kMask && mask_all) {  // straight-line, no tile read
#pragma unroll
      for (int j = 0; j < kTilesM; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = fast_exp2(fmaf(st[j][e], scale_log2, -lse_s[q_col0 + j * 8 + (lane % 4) * 2 + (e & 1)]));
    } else {  // straight-line: no per-element branch in the common case
#pragma unroll
      for (int j = 0; j < kTilesM; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = fast_exp2(fmaf(st[j][e], scale_log2, exponent_offset(j, e)));
    }
    wgmma::wait<0>();
    wgmma::pin(dpt);
    // dS^T = P^T (dP^T - delta), then both as 16-bit A operands.
    uint32_t pt[kTilesM / 2][4], dst[kTilesM / 2][4];
    // kDropout: the forward's decisions (drop_keyed), from the rows' keys and this thread's keys' word, both folded: its
    // two keys are 8 apart with the first's bit 3 clear (dropout_keys_pair_up), so one finalizer a query decides both.
    // kExtras: likewise where the keys pair up (dropout_pairs_keyed), the rows' keys formed here; else pair by pair.
    [[maybe_unused]] uint32_t threshold_high = 0, key_word = 0;
    [[maybe_unused]] const DropoutRows drop = kExtras ? dropout_rows(a, b, h) : DropoutRows{};
    [[maybe_unused]] const bool keyed = kExtras && dropout_pairs_keyed(a);
    [[maybe_unused]] float keep_scale = 1.0f;
    [[maybe_unused]] const uint32_t* drop_keys_s = nullptr;
    if (kDropout || keyed) {
      threshold_high = dropout_threshold_high(dropout_threshold(a.dropout_prob));
      keep_scale = 1.0f / (1.0f - a.dropout_prob);
      key_word = mix32_fold(dropout_key_word(key_pos[0]));
    }
    if constexpr (kDropout) drop_keys_s = drop_key_buffers[buffer];
#pragma unroll
    for (int j = 0; j < kTilesM; ++j) {
      [[maybe_unused]] uint32_t drop_bits[2];  // query column e & 1's dropout_pair_bits (its keys 0 and 1)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qcol = q_col0 + j * 8 + (lane % 4) * 2 + (e & 1);
        if constexpr (kExtras) {  // dropout's weight on dP and P (the forward's decision), dBias, the cap's derivative
          const float p = st[j][e];
          const int query = m0 + qcol;
          const int64_t kpos = key_pos[e / 2];
          const int64_t qpos = step.consecutive ? step.q_first + qcol : query < a.q_len ? q_position(a.pos, query) : 0;
          float weight = 1.0f;
          if (keyed)  // the query's row key for its key 0's finalizer (e < 2), read again for key 1
            weight = dropout_pair_weight(drop_bits, e, e < 2 ? drop.folded_row_key(qpos) : 0u, key_word, threshold_high,
                                         keep_scale);
          else if (p > 0.0f)
            weight = drop.weight(drop.row_key(qpos), kpos);
          float ds = p * (dpt[j][e] * weight - delta_s[qcol]);
          if (g.dbias.data && p > 0.0f) add_dbias(g, b, h, query, kpos, ds);
          if (soft_cap && p > 0.0f) {  // the bias read again: held from the step above it costs registers
            float bias = 0.0f;
            pair_bias_mask(a, b, h, query, kpos, bias);
            ds *= soft_cap_slope(p, lse_s[qcol], bias * kLog2e, a.soft_cap);
          }
          dpt[j][e] = ds;
          st[j][e] = p * weight;
          continue;
        }
        // dS = P (dP w - delta), and P w into dV: kDropout's w = 0 (dropped) or 1 / (1 - p), else 1. dBias is dS,
        // dropped pairs' too.
        const float p = st[j][e];
        float weight = 1.0f;
        if constexpr (kDropout)
          weight = dropout_pair_weight(drop_bits, e, drop_keys_s[qcol], key_word, threshold_high, keep_scale);
        dpt[j][e] = p * (dpt[j][e] * weight - delta_s[qcol]);
        if constexpr (kDropout) st[j][e] = p * weight;
        if constexpr (kBias) {
          if (g.dbias.data && p > 0.0f) add_dbias(g, b, h, m0 + qcol, key_pos[e / 2], dpt[j][e]);
        }
        if constexpr (kSoftCap) dpt[j][e] *= soft_cap_slope(p, lse_s[qcol], 0.0f, a.soft_cap);  // P = 0: dS = 0 anyway
      }
    }
#pragma unroll
    for (int kc = 0; kc < kTilesM / 2; ++kc) {
      pack_probabilities<T>(st, kc, pt[kc]);
      pack_probabilities<T>(dpt, kc, dst[kc]);
    }
    // A operands to shared memory: rows of keys, query q_col0 + j * 8 .. in chunk q_col0 / 8 + j.
    auto store_rows = [&](T* dst_s, const uint32_t (&frag)[kTilesM / 2][4]) {
#pragma unroll
      for (int kc = 0; kc < kTilesM / 2; ++kc)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int chunk = q_col0 / 8 + 2 * kc + half, col = (lane % 4) * 2;
          *reinterpret_cast<uint32_t*>(dst_s + wgmma::slab_offset<kBlockN>(key_row, chunk) + col) = frag[kc][2 * half];
          *reinterpret_cast<uint32_t*>(dst_s + wgmma::slab_offset<kBlockN>(key_row + 8, chunk) + col) = frag[kc][2 * half + 1];
        }
    };

    // dQ = dS K over this warpgroup's columns first (A is dS with queries contiguous, B is K with D
    // contiguous, both MN-major; 16 keys per k-step), then dV += P^T dO and dK += dS^T Q over its columns
    // of D (dO and Q are rows of queries, the k axis here: MN-major), so that dQ's atomics, which bound
    // this kernel, are issued while the tensor cores form dV and dK (with add_dq_rows' 64-byte quads, 3-18%
    // faster on H100 than dV and dK first). P^T and dS^T are A from registers, or where split from shared
    // memory (each warpgroup holds half of their query columns).
    const uint64_t do_mn = DSlabs::desc(do_addr + d_col0 / DSlabs::kCols * kBlockM * kDRowBytes, kBlockM * kDRowBytes,
                                        DSlabs::kAtomBytes);
    const uint64_t q_mn = DSlabs::desc(q_addr + d_col0 / DSlabs::kCols * kBlockM * kDRowBytes, kBlockM * kDRowBytes,
                                       DSlabs::kAtomBytes);
    if constexpr (Traits::kSplit) store_rows(p_s, pt);
    store_rows(ds_s, dst);
    wgmma::fence_shared_writes();
    if constexpr (kOrdered) {
      if (tid == 0) wait_dq_turn(turn);
    }
    __syncthreads();  // both warpgroups' dS^T (and P^T) columns are in (and under kOrdered, dQ's turn has come)
    [[maybe_unused]] float dq[kTilesDq][4];  // (kDqApart: none)
    wgmma::fence();
    if constexpr (!kDqApart) {
#pragma unroll
      for (int kc = 0; kc < kBlockN / 16; ++kc)
        wgmma::mma_ss<T, kTilesDq, true, true>(dq, wgmma::advance(ds_desc, kc * 16 * kRowBytes),
                                               wgmma::advance(dq_k_desc, kc * 16 * kDRowBytes), kc > 0);
      wgmma::commit();
    }
    if constexpr (Traits::kSplit) {
      const uint64_t pt_desc = wgmma::sw128_desc(smem_address(p_s), 16, kSwizzleAtom);
      const uint64_t dst_desc = wgmma::sw128_desc(ds_addr, 16, kSwizzleAtom);
#pragma unroll
      for (int kc = 0; kc < kBlockM / 16; ++kc)
        wgmma::mma_ss<T, kTilesD, false, true>(dv, wgmma::advance(pt_desc, kc * 32), wgmma::advance(do_mn, kc * 16 * kDRowBytes), 1);
#pragma unroll
      for (int kc = 0; kc < kBlockM / 16; ++kc)
        wgmma::mma_ss<T, kTilesD, false, true>(dk, wgmma::advance(dst_desc, kc * 32), wgmma::advance(q_mn, kc * 16 * kDRowBytes), 1);
    } else {
#pragma unroll
      for (int kc = 0; kc < kBlockM / 16; ++kc) wgmma::mma_rs_tb<T, kTilesD>(dv, pt[kc], wgmma::advance(do_mn, kc * 16 * kDRowBytes));
#pragma unroll
      for (int kc = 0; kc < kBlockM / 16; ++kc) wgmma::mma_rs_tb<T, kTilesD>(dk, dst[kc], wgmma::advance(q_mn, kc * 16 * kDRowBytes));
    }
    wgmma::commit();
    if constexpr (!kDqApart) {
      wgmma::wait<1>();  // dQ's group is done; dV's and dK's run on
      wgmma::pin(dq);
      add_dq_rows<kPadded, kTilesDq>(g, dq, b, h, m0 + (Traits::kDqSplitsRows ? group * 64 : 0) + (warp % 4) * 16 + lane / 4,
                                     Traits::kDqSplitsRows ? 0 : group * kTilesDq * 8, lane);
    }
    // Every thread has read this step's bias or mask (the barrier above): the next step's lands while dV and dK
    // form.
    if constexpr (kBias || kMask) {
      if (next) load_staged(next_h, next_m0, mask_all_buffers[1 - buffer]);
      copy_commit();
    }
    wgmma::wait<0>();
    wgmma::pin(dk);
    wgmma::pin(dv);
    if constexpr (!Traits::kSplit) {  // A operands in registers: alive until their wgmma is waited for
      wgmma::pin(pt);
      wgmma::pin(dst);
    }
    if constexpr (kOrdered) passed = turn;
    if (next && tid < kBlockM) lse_buffers[1 - buffer][tid] = next_lse, delta_buffers[1 - buffer][tid] = next_delta;
    h = next_h;
    m0 = next_m0;
    kind = next_kind;
    have = next;
    buffer = 1 - buffer;
  }
  copy_wait_all();
  if constexpr (kOrdered) {
    __syncthreads();  // the last step's dQ adds are all issued
    if (tid == 0 && passed.counter) pass_dq_turn(passed);
  }
  if (g.dk_dv_by_tma) {
    // A single call's dK and dV into K's and V's tiles, stored by the TMA unit: per-thread 4-byte stores queued
    // behind the last step's dQ atomics, a sixth of a short document's backward (bench/RESULTS.md).
    __syncthreads();  // both warpgroups' last products are done with K and V
    stage_fragment_rows<T, kBlockN, DSlabs>(k_s, dk, a.scale, key_row, d_col0, lane);
    stage_fragment_rows<T, kBlockN, DSlabs>(v_s, dv, 1.0f, key_row, d_col0, lane);
    wgmma::fence_shared_writes();
    __syncthreads();
    if (tid == 0) {
      tma::store_row_slabs<kBlockN, D, DSlabs::kCols>(&g.dk_map, k_s, n0, kh, b);
      tma::store_row_slabs<kBlockN, D, DSlabs::kCols>(&g.dv_map, v_s, n0, kh, b);
      tma::wait_stores_read();
    }
  } else {
    add_dk_dv_rows<T, kPadded>(g, dk, dv, b, kh, n0 + key_row, d_col0, lane);
  }
#endif
}

}  // namespace ra::wgmma_backward
