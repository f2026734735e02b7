// FlashAttention forward on Hopper's warpgroup MMA. A block of two warpgroups owns 128 query rows of
// one (batch, head), 64 rows per warpgroup; K/V tiles of 128 keys (96 at head_dim 192, 64 at 256, for
// shared memory; MLA's 192 / 128 has an instance of its own, V of 128 columns, 128-key tiles) stream
// through double-buffered shared memory, loaded by TMA. Per tile each warpgroup issues S = Q K^T as wgmma
// with both operands in shared memory and O += P V for the previous tile with P straight from registers
// (the accumulator layout of S is wgmma's register layout of A) and V read transposed from shared memory,
// then runs the online softmax of S while the tensor cores work on P V. At head_dim 128 and in MLA's
// instance (no cap, no segment ids) the two warpgroups take turns issuing their products
// (FlashAttention-3's ping-pong). Masking and the tile schedule are the mma.sync kernel's (flash_tile.cuh);
// a bias alone and a boolean mask alone at head_dim 64 and 128 have instances of their own, each warpgroup's
// rows of the next tile's bias or mask staged in shared memory (bias_tile.cuh, mask_tile.cuh). The body is
// compiled for sm_90a only.
#include "attention/cuda/flash_wgmma.h"

#include "attention/cuda/bias_tile.cuh"
#include "attention/cuda/dispatch.cuh"
#include "attention/cuda/flash_cuda.h"
#include "attention/cuda/flash_tile.cuh"
#include "attention/cuda/mask_tile.cuh"
#include "attention/cuda/mask_tiles.h"
#include "attention/cuda/tensor_map.h"
#include "attention/cuda/tma.cuh"
#include "attention/cuda/wgmma.cuh"
#include "runtime/cuda_device.h"

namespace ra {
namespace {

using namespace flash;

constexpr int kGroups = 2;                // warpgroups per block
constexpr int kThreads = kGroups * 128;
[[maybe_unused]] constexpr int kWarps = kThreads / 32;  // used by the sm_90a body only
constexpr int kBlockM = kGroups * 64;     // query rows per block
constexpr int kMaskWholeTiles = 2048;    // the mask instance's steps whose state a block holds (256K keys from its first)
// Keys per K/V tile: 128, or what Q and two K and V buffers leave room for in shared memory: 96 at
// head_dim 192, 64 at 256 (192 KiB each); MLA's instance (D = 192, Dv = 128) 128 (208 KiB). The bias
// instance (kBias) has two bias tiles of 128 rows beside them: 64 keys at head_dim 128 (166 KiB); the mask
// instance's two tiles of bytes leave 128 (197 KiB).
template <int D, int Dv, bool kBias = false>
constexpr int kBlockNFor = kBias && D == 128      ? 64
                           : D == 192 && Dv == 192 ? 96
                           : D > 128 && Dv > 128   ? 64
                                                   : 128;
// The bias instance's tiles: rows of kBlockN keys 8 floats apart more, so that a fragment's eight rows of
// four key pairs (read as float2) fall into 32 different banks each half-warp.
template <int kBlockN>
constexpr int kBiasStride = kBlockN + 8;
using wgmma::kRowBytes;
using wgmma::kSwizzleAtom;

template <typename T, int D, int kRows, bool kPadded>
__device__ __forceinline__ void load_slabs(T* dst, const DeviceView4& src, int b, int head, int row0, int rows_total,
                                           int cols, int tid) {
  load_rows<T, D, kRows, kThreads, kPadded>(dst, src, b, head, row0, rows_total, cols, tid,
                                   [](int r, int c) { return wgmma::slab_offset<kRows>(r, c); });
}

// kSegments: an instance that reads segment ids (the tiles of the block's documents only, found by
// binary search where the ids are sorted; ids compared in masked tiles); the others compile without
// them. Never launched behind a carry writer (SegmentRanges clears it).
// How a block meets the carry. kFromCarry: it starts from the carry, whose loads then overlap Q's, and
// stores it at the end. kAfterCarryWriter: launched behind the previous block's kernel
// (CudaAttentionArgs::after_carry_writer), this block's part starts empty and meets the carry at the end
// (merge_into_carry). kDirect: a single call (CudaAttentionArgs::o_direct) starts empty and writes O
// and LSE, no carry at all. Instantiations rather than a branch: the kernel sits at its register limit
// and either branch in the other's code slowed it by 2%.
enum class CarryMode { kFromCarry, kAfterCarryWriter, kDirect };

// kSoftCap: an instance that caps the scores (CudaAttentionArgs::soft_cap), with or without segment ids.
// kExtras: an instance that masks every tile pair by pair with the soft cap, the bias and mask tensors,
// and drops probabilities (flash_has_extras; always with kSegments, never after a carry writer).
// kPadded: head dims narrower than D (dispatch_flash_instance): zero columns loaded, never stored.
// Dv: V's and O's columns, D's but in MLA's instance (D = 192, Dv = 128), whose O would otherwise form 64
// columns from zeros.
// kBias: an additive bias (flash_takes_bias_instance), masked by positions as without it: each warpgroup stages its
// 64 rows of a tile's bias in shared memory while the tile before it computes. kMask: a boolean mask
// (flash_takes_mask_instance), staged the same way, a byte a pair.
// kDropout: dropout beside positions and segment ids (flash_takes_dropout_beside_positions), or beside kBias or kMask:
// each row's dropout key formed once, each pair's decision from it and the key's position (drop_keyed), tiles masked
// as without it.
template <typename T, int D, CarryMode kMode, bool kSegments, bool kSoftCap, bool kExtras, bool kPadded, int Dv = D,
          bool kBias = false, bool kMask = false, bool kMaskWhole = false, bool kDropout = false>
__global__ void __launch_bounds__(kThreads, 1)
    flash_wgmma_kernel(const CudaAttentionArgs a, const __grid_constant__ KvMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!(kBias || kMask) || !(kSegments || kSoftCap || kExtras || (kBias && kMask)) && Dv == D,
                "the bias or the mask alone");
  static_assert(!kDropout || !(kSoftCap || kExtras), "dropout beside positions and segment ids, or a bias or mask");
  constexpr bool kStaged = kBias || kMask;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = wgmma::align_to_swizzle_atom(smem_raw);
  constexpr int kBlockN = kBlockNFor<D, Dv, kBias>;
  T* q_smem = reinterpret_cast<T*>(smem);
  T* k_smem = q_smem + kBlockM * D;      // two buffers of kBlockN x D
  T* v_smem = k_smem + 2 * kBlockN * D;  // two buffers of kBlockN x Dv
  __shared__ int64_t warp_q_lo[kWarps], warp_q_hi[kWarps];

  // The next kernel on the stream, when launched as dependent of this one, may start on the SMs this
  // grid's last blocks leave idle: all of its inputs but the carry are ready (see merge_into_carry).
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, group = warp / 4;
  // kBias: two buffers of kBlockM rows of keys' bias; this warpgroup's are its own 64 rows of each.
  constexpr int kBiasRowStride = kBiasStride<kBlockN>;
  [[maybe_unused]] float* const group_bias =
      reinterpret_cast<float*>(v_smem + 2 * kBlockN * Dv) + group * 64 * kBiasRowStride;
  // kMask likewise, bytes; kMaskWhole then 16 rows of ones (the pairs of a tile the mask keeps whole) and, per
  // warpgroup, which of the block's tiles from `first` on the mask keeps whole (the summary's kMaskTileAll).
  constexpr int kMaskRowStride = kMaskStride<kBlockN>;
  [[maybe_unused]] uint8_t* const mask_smem = reinterpret_cast<uint8_t*>(v_smem + 2 * kBlockN * Dv);
  [[maybe_unused]] uint8_t* const group_mask = mask_smem + group * 64 * kMaskRowStride;
  [[maybe_unused]] uint8_t* const mask_ones = mask_smem + 2 * kBlockM * kMaskRowStride;
  [[maybe_unused]] uint8_t* const group_whole = mask_ones + 16 * kMaskRowStride + group * kMaskWholeTiles;
  // Causal: later query rows see more keys. Blocks start in index order, so the longest go first and
  // the last wave is made of short ones (a shorter tail).
  const int m_block = a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int m0 = m_block * kBlockM, h = blockIdx.y, b = blockIdx.z;
  const int kh = h / (a.q_heads / a.kv_heads);
  constexpr int kTilesDv = Dv / 8, kTilesN = kBlockN / 8;

  load_slabs<T, D, kBlockM, kPadded>(q_smem, a.q, b, h, m0, a.q_len, a.head_dim, tid);
  copy_commit();
  // Warp w owns rows m0 + 16 w .. + 15 (warpgroup w / 4 the 64 rows from m0 + 64 (w / 4)).
  const int warp_row0 = m0 + warp * 16, row0 = warp_row0 + lane / 4;
  {
    int64_t lo, hi;
    warp_query_range<16>(a, warp_row0, lane, lo, hi);
    if (lane == 0) warp_q_lo[warp] = lo, warp_q_hi[warp] = hi;
  }
  // kDropout: every row's dropout key, formed once for all its tiles (registers held across the tiles spill).
  __shared__ std::conditional_t<kDropout, uint32_t[kBlockM], char> drop_row_keys;
  if constexpr (kDropout) {
    if (tid < kBlockM)
      drop_row_keys[tid] = dropout_folded_row_key_at(a, b, h, m0 + tid);
  }
  __syncthreads();
  int64_t block_q_lo = INT64_MAX, block_q_hi = INT64_MIN, group_q_lo = INT64_MAX, group_q_hi = INT64_MIN;
  for (int w = 0; w < kWarps; ++w) {
    block_q_lo = min(block_q_lo, warp_q_lo[w]), block_q_hi = max(block_q_hi, warp_q_hi[w]);
    if (w / 4 == group) group_q_lo = min(group_q_lo, warp_q_lo[w]), group_q_hi = max(group_q_hi, warp_q_hi[w]);
  }

  float o[kTilesDv][4], m_row[2], l_row[2];
  const int64_t carry_row0 = (int64_t(b) * a.q_heads + h) * a.q_len;
  if constexpr (kMode != CarryMode::kFromCarry) {
    m_row[0] = m_row[1] = -INFINITY, l_row[0] = l_row[1] = 0.0f;
#pragma unroll
    for (int j = 0; j < kTilesDv; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  } else {
    load_carry<kPadded>(a, carry_row0, row0, lane, o, m_row, l_row);
  }
  const float scale_log2 = a.scale * kLog2e;

  int2 group_seg{}, tile_seg{};  // this warpgroup's segment ids and step i's keys' (ranges of 64-row chunks)
  if (kSegments && a.q_segment_ranges) group_seg = segment_range(a.q_segment_ranges, a.q_len, b, m0 + group * 64, 64);
  int first, last;
  block_visible_tiles<kBlockN, kBlockM, kSegments>(a, b, m0, block_q_lo, block_q_hi, first, last);
  // kMask: the tiles before the first the mask keeps a pair of in this block's rows, and after the last, are left out
  // (MaskTiles). kMaskWhole (where the kept summary says the mask keeps at least half its tiles whole): each
  // warpgroup's states of the tiles between are read into shared memory once, and the tiles the mask keeps whole (a
  // document's inside) are neither staged nor read, their pairs taken from the ones. Its spills cost a mask that keeps
  // no tile whole a fifth (H100, a dense random mask 326 TFLOP/s against 405; documents 1.09-1.23x), hence two
  // instances (bench/RESULTS.md, "A named mask summarised once").
  [[maybe_unused]] int whole_span = 0;  // steps with a known state: [0, whole_span)
  if constexpr (kMask) {
    static_assert(kBlockN == kMaskTileKeys && kBlockM == 2 * kMaskChunkRows, "a warpgroup's rows: a chunk of the summary");
    const DeviceMaskTiles& t = a.mask_tiles;
    if (t.states) {
      const int map = mask_tiles_map(t, b, h);
      narrow_to_mask_tiles<kBlockM>(t, map, m0, first, last);
      if constexpr (kMaskWhole) {
        whole_span = max(0, min(last - first + 1, kMaskWholeTiles));
        for (int x = tid; x < 2 * whole_span; x += kThreads) {
          const int g = x / whole_span, i = x % whole_span, chunk = m0 / kMaskChunkRows + g;
          // The state's index written out rather than mask_state_at(t, map, first + i, chunk): that form (first + i
          // in 32 bits) moved ptxas' allocation, and the kDirect instance's stack went from 96 to 152 bytes (the named
          // 16 documents' forward 0.82x segment ids' instead of 0.98x, H100, bench/RESULTS.md).
          mask_ones[16 * kMaskRowStride + g * kMaskWholeTiles + i] =
              chunk < t.row_chunks &&
              (t.states[(int64_t(map) * t.key_tiles + first + i) * t.row_chunks + chunk] & kMaskTileAll);
        }
        for (int x = tid; x < 16 * kMaskRowStride / 4; x += kThreads)
          reinterpret_cast<uint32_t*>(mask_ones)[x] = 0x01010101u;
      }
    }
    if constexpr (kMaskWhole) __syncthreads();  // (before the first tile is staged)
  }
  const int tiles = last - first + 1;  // <= 0: none
  [[maybe_unused]] auto kept_whole = [&](int i) { return kMaskWhole && i < whole_span && group_whole[i] != 0; };
  // Step i starts loading K_{i+1} and V_i into the buffers step i - 1 read, and waits for K_i and V_{i-1}.
  // kTurns: the warpgroups take turns issuing their products (wgmma::IssueTurns), warpgroup 0 first, so that
  // one's softmax runs while the other's products do; the loads are started by warpgroup 1, which runs
  // behind: its own step i - 1 is done, and warpgroup 0's is awaited on leader_done (warpgroup 0 arrives
  // once its products of a step have landed, so it is not held up itself). Otherwise a block barrier a
  // step keeps the warpgroups in lockstep and thread 0 loads.
  // Measured on one H200 (bf16, T = 32768, bench/RESULTS.md, "The wgmma forward's warpgroups take turns"):
  // turns 1.003-1.05x at head_dim 128 (most causal), level at 192, 0.94-0.95x at 256 and 0.985x at 64
  // (shorter steps: 64-key tiles or 64 columns leave less product to hide a softmax behind); 0.97-0.98x
  // capped, 0.90-1.06x on causal documents (blocks of few tiles; the extras instance has segment ids too);
  // MLA's instance 1.20-1.21x (S's 12 k-steps against 8 at 128: more product to hide a softmax behind;
  // "MLA's forward: V and O of 128 columns").
  constexpr bool kTurns = (D == 128 || (D == 192 && Dv == 128)) && !kSoftCap && !kSegments;
  const wgmma::IssueTurns turns{group};
  constexpr int kLoader = kTurns ? 128 : 0;
  // K and V tiles come by TMA, started by one thread, each buffer's landing counted by its mbarrier: the
  // per-thread copies cost this register-bound kernel 1.11-1.35x.
  __shared__ alignas(8) uint64_t k_landed[2], v_landed[2], leader_done[2];
  tma::Landings k_in{k_landed}, v_in{v_landed}, leader_in{leader_done};
  auto load_k = [&](int buffer, int tile) {
    tma::load_row_tile<kBlockN, D>(k_smem + buffer * kBlockN * D, &maps.k, tile * kBlockN, kh, b, &k_landed[buffer]);
  };
  auto load_v = [&](int buffer, int tile) {
    tma::load_row_tile<kBlockN, Dv>(v_smem + buffer * kBlockN * Dv, &maps.v, tile * kBlockN, kh, b, &v_landed[buffer]);
  };
  wgmma::by_thread_zero(tid, [&] {
    k_in.init(2), v_in.init(2);
    if constexpr (kTurns) leader_in.init(2);
    tma::fence_barrier_init();
    if (tiles > 0) load_k(0, first);
  });

  // kBias / kMask: step i's bias or mask tile into buffer i % 2, this warpgroup's rows by its own threads.
  auto load_staged = [&](int i) {
    if constexpr (kBias)
      load_bias_tile<64, kBlockN, kBiasRowStride, 128>(group_bias + (i % 2) * kBlockM * kBiasRowStride, a, b, h,
                                                       m0 + group * 64, (first + i) * kBlockN, tid % 128);
    if constexpr (kMask)
      if (!kept_whole(i))
        load_mask_tile<64, kBlockN, kMaskRowStride, 128>(group_mask + (i % 2) * kBlockM * kMaskRowStride, a, b, h,
                                                         m0 + group * 64, (first + i) * kBlockN, tid % 128);
    if constexpr (kStaged) copy_commit();
  };
  // Before step i's softmax: its tile has landed for the whole warpgroup, whose every thread is done with
  // step i - 1's, so step i + 1's loads into that buffer now.
  auto staged_landed = [&](int i) {
    copy_wait_all();
    asm volatile("bar.sync %0, 128;\n" ::"r"(3 + group) : "memory");  // (barriers 1 and 2: IssueTurns)
    if (i + 1 < tiles) load_staged(i + 1);
  };
  // This warpgroup's 64 Q rows; a k-step of 16 columns is 32 bytes inside a slab.
  const uint32_t q_rows = smem_address(q_smem) + group * 64 * kRowBytes;
  auto begin_step = [&](int i) {
    const int tile = first + i;
    if constexpr (!kTurns) __syncthreads();  // step i - 1's products are done with the buffers loaded next
    if (tid == kLoader && i < tiles) {       // (a plain branch per step: see wgmma::by_thread_zero)
      if (kTurns && i > 0) leader_in.wait((i - 1) % 2);
      if (i + 1 < tiles) load_k((i + 1) % 2, tile + 1);
      load_v(i % 2, tile);
    }
    if (i < tiles) k_in.wait(i % 2);    // K_i
    if (i > 0) v_in.wait((i - 1) % 2);  // V_{i-1}
    // Read now, used by this step's softmax: the load lands while the tensor cores work.
    if (kSegments && a.kv_segment_ranges && i < tiles)
      tile_seg = segment_range(a.kv_segment_ranges, a.kv_len, b, tile * kBlockN, kBlockN);
  };
  auto issue_qk = [&](int i, float(&s)[kTilesN][4]) {
    const uint32_t k_tile = smem_address(k_smem + (i % 2) * kBlockN * D);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t slab = kk / 4, step = (kk % 4) * 32;
      const uint64_t q_desc = wgmma::sw128_desc(q_rows + slab * kBlockM * kRowBytes + step, 16, kSwizzleAtom);
      const uint64_t k_desc = wgmma::sw128_desc(k_tile + slab * kBlockN * kRowBytes + step, 16, kSwizzleAtom);
      wgmma::mma_ss<T, kTilesN>(s, q_desc, k_desc, kk > 0);
    }
    wgmma::commit();
  };
  // V is [keys][D]: N-major for this product. 16 keys per k-step; column slabs kBlockN rows apart.
  // One wgmma spans at most 128 columns of O and whole slabs (an MN-major operand's N axis): head_dim 256
  // takes two of 128, 192 one of 128 and one of 64, each starting at its first slab.
  auto issue_pv = [&](int i, const uint32_t(&p)[kBlockN / 16][4]) {
    const uint32_t v_tile = smem_address(v_smem + (i % 2) * kBlockN * Dv);
    constexpr int kTilesFirst = kTilesDv > 16 ? 16 : kTilesDv, kTilesRest = kTilesDv - kTilesFirst;
    auto& o_first = *reinterpret_cast<float(*)[kTilesFirst][4]>(&o[0]);
#pragma unroll
    for (int kc = 0; kc < kBlockN / 16; ++kc) {
      const uint32_t keys = v_tile + kc * 16 * kRowBytes;
      wgmma::mma_rs_tb<T>(o_first, p[kc], wgmma::sw128_desc(keys, kBlockN * kRowBytes, kSwizzleAtom));
      if constexpr (kTilesRest > 0) {
        auto& o_rest = *reinterpret_cast<float(*)[kTilesRest][4]>(&o[kTilesFirst]);
        const uint32_t rest = keys + (kTilesFirst / 8) * kBlockN * kRowBytes;
        wgmma::mma_rs_tb<T>(o_rest, p[kc], wgmma::sw128_desc(rest, kBlockN * kRowBytes, kSwizzleAtom));
      }
    }
    wgmma::commit();
  };
  // The softmax of S_i in place (probabilities, not yet 16-bit) and the factor that rescales O.
  auto softmax_tile = [&](int i, float(&s)[kTilesN][4], float(&alpha)[2]) {
    const int tile = first + i;
    int64_t k_lo, k_hi;
    tile_key_range<kBlockN>(a, tile, lane, k_lo, k_hi);
    // Tiles this warpgroup sees whole keep raw scores and fold the scale into the exponent's FFMA.
    BlockKind kind = classify_block(group_q_lo, group_q_hi, k_lo, k_hi, a.causal, a.window_left, a.window_right);
    // Masked tiles compare columns with each row's visible ones (mask_positions).
    TileKeys keys{a.pos.keys_sorted && k_hi - k_lo == min(kBlockN, a.kv_len - tile * kBlockN) - 1, k_lo};
    if (kSegments && a.kv_segment_ranges) {
      kind = with_segments(a, kind, group_seg, tile_seg);
      keys.one_segment = tile_seg.x == tile_seg.y, keys.segment = tile_seg.x;
    }
    const bool masked = kExtras || kind != BlockKind::kFull || (tile + 1) * kBlockN > a.kv_len;
    float scale = scale_log2;  // what turns s into log2-unit logits
    if (kSoftCap || (kExtras && a.soft_cap > 0.0f)) {
      soft_cap_scores<true>(s, a.scale / a.soft_cap, a.soft_cap * kLog2e);
      scale = 1.0f;
    }
    if (masked) mask_positions<kSegments, kTilesN, true>(a, s, b, tile * kBlockN, lane, row0, scale, &keys);
    if constexpr (kExtras) add_bias_mask(a, s, b, h, tile * kBlockN, lane, row0, &keys);
    if constexpr (kMask) {  // the pairs the mask hides become -inf (raw scores or log2 units alike)
      staged_landed(i);
      const uint8_t* rows = kept_whole(i) ? mask_ones + lane / 4 * kMaskRowStride
                                          : group_mask + (i % 2) * kBlockM * kMaskRowStride +
                                                (warp % 4 * 16 + lane / 4) * kMaskRowStride;
#pragma unroll
      for (int j = 0; j < kTilesN; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint16_t keep = *reinterpret_cast<const uint16_t*>(rows + half * 8 * kMaskRowStride + j * 8 + (lane % 4) * 2);
          if ((keep & 0xff) == 0) s[j][2 * half] = -INFINITY;
          if ((keep >> 8) == 0) s[j][2 * half + 1] = -INFINITY;
        }
    }
    if constexpr (kBias) {  // log2-unit logits plus the bias; hidden pairs stay -inf
      staged_landed(i);
      const float* rows = group_bias + (i % 2) * kBlockM * kBiasRowStride + (warp % 4 * 16 + lane / 4) * kBiasRowStride;
      const float to_log2 = masked ? 1.0f : scale;
#pragma unroll
      for (int j = 0; j < kTilesN; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float2 bias =
              *reinterpret_cast<const float2*>(rows + half * 8 * kBiasRowStride + j * 8 + (lane % 4) * 2);
          s[j][2 * half] = fmaf(s[j][2 * half], to_log2, bias.x * kLog2e);
          s[j][2 * half + 1] = fmaf(s[j][2 * half + 1], to_log2, bias.y * kLog2e);
        }
    }
    softmax_probabilities(s, m_row, l_row, masked || kBias ? 1.0f : scale, alpha);
    if (kExtras && a.dropout_prob > 0.0f) drop_probabilities(a, s, b, h, tile * kBlockN, lane, row0, &keys);
    if constexpr (kDropout) {
      const uint32_t row_folded[2] = {drop_row_keys[row0 - m0], drop_row_keys[row0 + 8 - m0]};
      drop_keyed(a, s, row_folded, tile * kBlockN, lane, &keys);
    }
  };
  auto pack = [&](const float(&s)[kTilesN][4], uint32_t(&p)[kBlockN / 16][4]) {
#pragma unroll
    for (int kc = 0; kc < kBlockN / 16; ++kc) pack_probabilities<T>(s, kc, p[kc]);
  };

  // K_i lives in K buffer i % 2 and V_i in V buffer i % 2 (i counts from `first`). Step i issues
  // S_i = Q K_i^T, rescales O to P_{i-1}'s max meanwhile, issues O += P_{i-1} V_{i-1}, and runs the
  // softmax of S_i while the tensor cores work on that product. P_i is written to the registers the
  // product reads only once it has landed. The first and last steps are peeled so that every wait
  // has one fixed number of groups in flight.
  auto take_turn = [&] {
    if constexpr (kTurns) turns.wait();
  };
  auto pass_turn = [&] {
    if constexpr (kTurns) turns.pass();
  };
  auto step_landed = [&](int i) {  // warpgroup 0's products of step i have landed: their buffers may be reloaded
    if (kTurns && tid == 0 && i + 1 < tiles) tma::arrive(&leader_done[i % 2]);
  };
  if constexpr (kStaged) {
    if (tiles > 0) load_staged(0);
  }
  copy_wait_all();               // Q (and the bias or mask instance's first tile)
  wgmma::fence_shared_writes();  // cp.async wrote Q through the generic proxy; wgmma reads through the async one
  __syncthreads();               // every thread's Q rows, and the barriers' initialisation
  if constexpr (kDropout && kMode == CarryMode::kFromCarry) scale_fragment(o, 1.0f - a.dropout_prob);  // (see the end)
  if (tiles > 0) {
    uint32_t p[kBlockN / 16][4];  // P_{i-1}: read by the tensor cores during step i
    float alpha[2];               // rescales O from the max before P_{i-1} to P_{i-1}'s
    if constexpr (kTurns) turns.start();
    {
      float s[kTilesN][4];
      begin_step(0);
      take_turn();
      wgmma::fence();
      issue_qk(0, s);
      pass_turn();
      wgmma::wait<0>();
      step_landed(0);
      wgmma::pin(s);
      softmax_tile(0, s, alpha);
      pack(s, p);
    }
    for (int i = 1; i < tiles; ++i) {
      float s[kTilesN][4];
      begin_step(i);
      take_turn();
      wgmma::fence();
      issue_qk(i, s);
      rescale_rows(o, alpha);
      wgmma::fence();
      issue_pv(i - 1, p);
      pass_turn();
      wgmma::wait<1>();  // S_i, the older group, has landed
      wgmma::pin(s);
      softmax_tile(i, s, alpha);
      wgmma::wait<0>();
      step_landed(i);
      wgmma::pin(o);
      wgmma::pin(p);
      pack(s, p);
    }
    begin_step(tiles);
    take_turn();
    rescale_rows(o, alpha);
    wgmma::fence();
    issue_pv(tiles - 1, p);
    pass_turn();
    wgmma::wait<0>();
    wgmma::pin(o);
    if constexpr (kTurns) turns.finish();
  }
  // drop_keyed left kept pairs' P unscaled: 1 / (1 - p) once here instead of per pair (a carry's O, scaled by 1 - p
  // above, comes back to within rounding).
  if constexpr (kDropout) scale_fragment(o, 1.0f / (1.0f - a.dropout_prob));
  if constexpr (kMode == CarryMode::kFromCarry) {
    store_carry<kPadded>(a, carry_row0, row0, lane, o, m_row, l_row);
  } else if constexpr (kMode == CarryMode::kDirect) {
    store_output<T, kPadded>(a, b, h, row0, lane, o, m_row, l_row);
  } else {
    // The kernel this one was launched behind has finished and its carry writes are visible. Every
    // block waits, those that see no key too: the next kernel waits only for this grid, so a grid of
    // empty blocks that ended early would let it merge before the carry writer before this one is done.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (tiles > 0) merge_into_carry<kPadded>(a, carry_row0, row0, lane, o, m_row, l_row);  // empty: carry left as it is
  }
#endif
}

template <typename T, int D, int Dv, bool kBias = false, bool kMask = false, bool kMaskWhole = false>
constexpr size_t smem_bytes() {
  constexpr int kBlockN = kBlockNFor<D, Dv, kBias>;
  return size_t(kBlockM * D + 2 * kBlockN * (D + Dv)) * sizeof(T) +
         (kBias ? 2 * size_t(kBlockM) * kBiasStride<kBlockN> * sizeof(float) : 0) +
         (kMask ? 2 * size_t(kBlockM) * kMaskStride<kBlockN> : 0) +
         (kMaskWhole ? 16 * size_t(kMaskStride<kBlockN>) + 2 * kMaskWholeTiles : 0) + kSwizzleAtom;  // + alignment slack
}
static_assert(smem_bytes<__nv_bfloat16, 256, 256>() <= 227 * 1024 &&
                  smem_bytes<__nv_bfloat16, 192, 192>() <= 227 * 1024 &&
                  smem_bytes<__nv_bfloat16, 192, 128>() <= 227 * 1024,
              "Q and two K and V buffers fit Hopper's shared memory");
static_assert(smem_bytes<__nv_bfloat16, 64, 64, true>() <= 227 * 1024 &&
                  smem_bytes<__nv_bfloat16, 128, 128, true>() <= 227 * 1024,
              "the bias instances' two bias tiles beside them");
static_assert(smem_bytes<__nv_bfloat16, 64, 64, false, true, true>() <= 227 * 1024 &&
                  smem_bytes<__nv_bfloat16, 128, 128, false, true, true>() <= 227 * 1024,
              "the mask instances' two mask tiles beside them, the ones and the states of the tiles kept whole");

// One instance's launch: kBlockN keys a K / V tile, smem bytes of dynamic shared memory.
template <typename T, int kBlockN, typename Kernel>
void launch_kernel(Kernel kernel, size_t smem, bool overlap_carry_writer, const CudaAttentionArgs& a,
                   cudaStream_t stream) {
  RA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned((a.q_len + kBlockM - 1) / kBlockM), unsigned(a.q_heads), unsigned(a.batch));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = overlap_carry_writer ? 1 : 0;
  config.attrs = &overlap;
  config.numAttrs = 1;
  RA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a, key_tiles_of<T>(a, kBlockN)));
}

// The bias instance (kBias) or the mask instance (kMask, after the mask's tile summary), with dropout or without:
// shared memory and tiles of their own, never behind a carry writer (as the extras).
template <typename T, int D, bool kPadded, bool kBias, bool kMask, bool kMaskWhole = false>
void launch_staged_kernel(const CudaAttentionArgs& with, cudaStream_t stream) {
  using enum CarryMode;
  auto launch_with = [&](auto dropout) {
    constexpr bool kDropout = decltype(dropout)::value;
    launch_kernel<T, kBlockNFor<D, D, kBias>>(
        with.o_direct
            ? flash_wgmma_kernel<T, D, kDirect, false, false, false, kPadded, D, kBias, kMask, kMaskWhole, kDropout>
            : flash_wgmma_kernel<T, D, kFromCarry, false, false, false, kPadded, D, kBias, kMask, kMaskWhole, kDropout>,
        smem_bytes<T, D, D, kBias, kMask, kMaskWhole>(), false, with, stream);
  };
  if (with.dropout_prob > 0.0f) return launch_with(std::true_type{});
  launch_with(std::false_type{});
}

template <typename T, int D, bool kPadded, bool kBias, bool kMask>
void launch_staged(const CudaAttentionArgs& a, cudaStream_t stream) {
  CudaAttentionArgs with = a;
  const MaskTiles mask_tiles(with, stream);  // (a bias instance's call has no mask: nothing)
  if constexpr (kMask)
    if (mask_tiles.keeps_tiles_whole()) return launch_staged_kernel<T, D, kPadded, kBias, kMask, true>(with, stream);
  launch_staged_kernel<T, D, kPadded, kBias, kMask>(with, stream);
}

// Dropout beside positions and segment ids (kDropout): never behind a carry writer (as the extras).
template <typename T, int D, bool kPadded, bool kSegments>
void launch_dropout(const CudaAttentionArgs& a, cudaStream_t stream) {
  using enum CarryMode;
  launch_kernel<T, kBlockNFor<D, D>>(
      a.o_direct ? flash_wgmma_kernel<T, D, kDirect, kSegments, false, false, kPadded, D, false, false, false, true>
                 : flash_wgmma_kernel<T, D, kFromCarry, kSegments, false, false, kPadded, D, false, false, false, true>,
      smem_bytes<T, D, D>(), false, a, stream);
}

template <typename T, int D, bool kPadded, int Dv = D>
void launch(const CudaAttentionArgs& a, cudaStream_t stream) {
  using enum CarryMode;
  // A bias, alone or beside dropout, on the 64 and 128 instances (head dims up to 128; 128 itself runs the padded
  // one): its own instance, the bias staged in shared memory, where the extras instance reads it pair by pair; a mask
  // likewise.
  if constexpr ((D == 64 || D == 128) && Dv == D) {
    if (flash_takes_bias_instance(a)) return launch_staged<T, D, kPadded, true, false>(a, stream);
    if (flash_takes_mask_instance(a)) return launch_staged<T, D, kPadded, false, true>(a, stream);
  }
  // Dropout beside positions and segment ids: its own instance at 64, 128 and 256 (Gemma's head dim).
  if constexpr ((D == 64 || D == 128 || D == 256) && Dv == D) {
    if (flash_takes_dropout_beside_positions(a))
      return a.q_segment_ranges ? launch_dropout<T, D, kPadded, true>(a, stream) : launch_dropout<T, D, kPadded, false>(a, stream);
  }
  const bool extras = flash_has_extras(a);
  // Template arguments after the carry mode: kSegments, kSoftCap, kExtras, kPadded, Dv.
  auto kernel =
      extras ? (a.o_direct ? flash_wgmma_kernel<T, D, kDirect, true, false, true, kPadded, Dv>
                           : flash_wgmma_kernel<T, D, kFromCarry, true, false, true, kPadded, Dv>)
      : a.soft_cap > 0.0f && a.q_segment_ranges
          ? (a.o_direct ? flash_wgmma_kernel<T, D, kDirect, true, true, false, kPadded, Dv>
                        : flash_wgmma_kernel<T, D, kFromCarry, true, true, false, kPadded, Dv>)
      : a.soft_cap > 0.0f
          ? (a.o_direct             ? flash_wgmma_kernel<T, D, kDirect, false, true, false, kPadded, Dv>
             : a.after_carry_writer ? flash_wgmma_kernel<T, D, kAfterCarryWriter, false, true, false, kPadded, Dv>
                                    : flash_wgmma_kernel<T, D, kFromCarry, false, true, false, kPadded, Dv>)
      : a.o_direct           ? (a.q_segment_ranges ? flash_wgmma_kernel<T, D, kDirect, true, false, false, kPadded, Dv>
                                                   : flash_wgmma_kernel<T, D, kDirect, false, false, false, kPadded, Dv>)
      : a.q_segment_ranges   ? flash_wgmma_kernel<T, D, kFromCarry, true, false, false, kPadded, Dv>
      : a.after_carry_writer ? flash_wgmma_kernel<T, D, kAfterCarryWriter, false, false, false, kPadded, Dv>
                             : flash_wgmma_kernel<T, D, kFromCarry, false, false, false, kPadded, Dv>;
  launch_kernel<T, kBlockNFor<D, Dv>>(kernel, smem_bytes<T, D, Dv>(), a.after_carry_writer && !extras, a, stream);
}

}  // namespace

bool flash_wgmma_available() {
  // The fatbin's image for this device: sm_90a code only when the build targeted 90a and the device is
  // a Hopper (other architectures get the empty sm_80 body, which must never run).
  static const bool available = [] {
    cudaFuncAttributes attributes{};
    return cuda_device_count() > 0 &&
           cudaFuncGetAttributes(&attributes, flash_wgmma_kernel<__nv_bfloat16, 128, CarryMode::kFromCarry, false, false,
                                                                         false, false>) == cudaSuccess &&
           attributes.binaryVersion == 90;
  }();
  return available;
}

void flash_wgmma_accumulate(const CudaAttentionArgs& a, DType dtype, cudaStream_t stream) {
  dispatch_half_dtype(dtype, "the wgmma flash_attn2 kernel", [&](auto element) {
    // Exact head dims of 128 run the padded instance, measured 1.07-1.09x the exact one; at 64 and 256 the exact
    // ones are 1.06x / 1.03x faster (H100, T = 32768, bf16: bench/RESULTS.md). 192 (and the dims between 128
    // and 192) has a padded instance of its own, 96-key tiles; where V is at most 128 wide (MLA's 192 / 128),
    // one whose V and O are 128 columns, 128-key tiles.
    if (a.head_dim > 128 && a.head_dim <= 192 && a.value_dim <= 128) {
      return launch<decltype(element), 192, true, 128>(a, stream);
    }
    dispatch_flash_instance_of<InstanceDims<64, 128, 192, 256>, 64, 256>(a.head_dim, a.value_dim, "the wgmma flash_attn2 kernel", [&](auto instance, auto padded) {
      launch<decltype(element), decltype(instance)::value, decltype(padded)::value>(a, stream);
    });
  });
}

}  // namespace ra
