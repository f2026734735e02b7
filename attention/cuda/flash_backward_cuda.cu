// FlashAttention-2's backward on tensor cores. A block of 8 warps owns 128 keys (64 at D = 256) of one
// (batch, K/V head); for each query head of the group and each 64-row query block that can see its keys
// it computes, in registers, S^T = K Q^T and dP^T = V dO^T (keys as rows, so that P^T and dS^T are
// ready-made A operands), P^T from LSE, dS^T = P^T (dP^T - delta), then dV += P^T dO and dK += dS^T Q.
// dS^T goes through shared memory once so that each warp can form 16 rows x D/2 of dQ = dS K, which are
// added to the f32 dQ accumulator with atomics (as FlashAttention-2 does). At D = 256 a warp's registers
// cannot hold dK and dV of 16 keys x 256, so two warps share 16 keys: each forms S^T / dP^T for half of
// the query block and owns half of D of dK / dV, and P^T joins dS^T in shared memory.
// Every option: positions and segment ids (query blocks that share no segment with the keys skipped),
// and with kExtras the mask, bias (dBias by atomics), soft cap (chain rule through tanh) and dropout
// regenerated from the forward's hash.
#include "attention/cuda/flash_backward_cuda.h"

#include <algorithm>

#include "attention/cuda/backward_cuda.h"
#include "attention/cuda/dispatch.cuh"
#include "attention/cuda/flash_backward_rows.cuh"
#include "attention/cuda/flash_cuda.h"
#include "attention/cuda/flash_wgmma_backward.h"
#include "attention/cuda/flash_tile.cuh"
#include "attention/cuda/mma_sync.cuh"
#include "attention/cuda/pair_logit.cuh"
#include "attention/cuda/segment_ranges.h"
#include "runtime/cuda_device.h"
#include "runtime/graph_capture.h"
#include "runtime/memory.h"

namespace ra {
namespace {

using namespace flash;

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kBlockM = 64;  // query rows per step
constexpr int kQTiles = kBlockM / 8;

template <typename T, int D>
struct BackwardTraits {
  // Warps per 16 keys: 1 while dK and dV of 16 keys x D fit a warp's registers, else 2 (each half of D).
  static constexpr int kDSplit = D > 128 ? 2 : 1;
  static constexpr int kKeyTiles = kWarps / kDSplit;
  static constexpr int kBlockN = kKeyTiles * 16;  // keys per block: dQ's atomics are per key block
  static constexpr int kQTilesPerWarp = kQTiles / kDSplit;  // S^T's 8-query tiles a warp forms
  static constexpr int kTilesDPerWarp = D / 8 / kDSplit;     // dK / dV's 8-column tiles a warp holds
  static constexpr bool kPInShared = kDSplit > 1;  // a warp's P^T rows are half in the other warp
  // K and V tiles, two buffers each of Q and dO (rows of D), dS^T (and P^T) of kBlockN keys x 64 queries.
  static constexpr size_t kSmemBytes =
      size_t(2 * kBlockN * D + 4 * kBlockM * D + (kPInShared ? 2 : 1) * kBlockN * kBlockM) * sizeof(T);
  static_assert(D % 16 == 0 && D / kDSplit <= 128, "dK and dV of 16 keys x D / kDSplit stay in registers");
  static_assert(kTilesDPerWarp % 2 == 0 && kQTilesPerWarp % 2 == 0, "fragments are loaded two 8-tiles at a time");
  static_assert(kWarps == 2 * (kBlockM / 16) && (D / 8) % 4 == 0, "dQ: each warp forms 16 query rows x half of D");
  static_assert(kSmemBytes <= 227 * 1024 - 1024, "one block's shared memory on an sm_90 SM");
};

// kSegments: an instance that skips query blocks by segment ids and compares them in masked steps (the
// extras one compares them in pair_logit); the others compile without them (at the register limit).
// kPadded: head dims narrower than D (dispatch_flash_instance): zero columns loaded, never stored.
// kSoftCap: P from the capped logits and dS times the cap's derivative (with kSegments, not kExtras).
// kDropout: dropout beside positions and segment ids (flash_takes_dropout_beside_positions, with kSegments), as the
// wgmma backward's instance takes it: each step's rows' dropout keys formed once, a thread's two keys (8 apart) decided
// by one finalizer a query.
template <typename T, int D, bool kExtras, bool kSegments, bool kPadded, bool kSoftCap = false, bool kDropout = false>
__global__ void __launch_bounds__(kThreads, 1) flash_backward_kernel(const FlashBackwardArgs g) {
  static_assert(!kDropout || (kSegments && !kExtras && !kSoftCap), "dropout beside positions and segment ids");
  using Traits = BackwardTraits<T, D>;
  constexpr int kBlockN = Traits::kBlockN, kQTilesPerWarp = Traits::kQTilesPerWarp;
  constexpr int kTilesDPerWarp = Traits::kTilesDPerWarp;
  const CudaAttentionArgs& a = g.a;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* k_s = reinterpret_cast<T*>(smem_raw);
  T* v_s = k_s + kBlockN * D;
  T* q_buffers = v_s + kBlockN * D;            // two buffers of kBlockM x D
  T* do_buffers = q_buffers + 2 * kBlockM * D;  // two buffers of kBlockM x D
  T* ds_s = do_buffers + 2 * kBlockM * D;       // dS^T: kBlockN keys x 64 queries
  T* p_s = ds_s + kBlockN * kBlockM;            // P^T likewise (kPInShared only)
  __shared__ float lse_buffers[2][kBlockM], delta_buffers[2][kBlockM];
  __shared__ int32_t segment_buffers[2][kBlockM];  // the step's query segment ids (with segment ids only)
  __shared__ std::conditional_t<kDropout, uint32_t[2][kBlockM], char> drop_key_buffers;  // the rows' keys, folded

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, mi = lane / 8;
  const int block = key_block(g), n0 = block * kBlockN, kh = blockIdx.y, b = blockIdx.z;
  const int group = a.q_heads / a.kv_heads;
  // This warp's 16 keys, and its share of them: the query tiles of S^T it forms and the columns of dK / dV it holds.
  const int key_tile = warp % Traits::kKeyTiles, split = warp / Traits::kKeyTiles;
  const int q_tile0 = split * kQTilesPerWarp, d_tile0 = split * kTilesDPerWarp;
  auto swz = [](int r, int c) { return swizzled<D>(r, c); };

  load_rows<T, D, kBlockN, kThreads, kPadded>(k_s, a.k, b, kh, n0, a.kv_len, a.head_dim, tid, swz);
  load_rows<T, D, kBlockN, kThreads, kPadded>(v_s, a.v, b, kh, n0, a.kv_len, a.value_dim, tid, swz);
  copy_commit();
  int64_t k_lo, k_hi;
  tile_key_range<kBlockN, Positions::kRead>(a, block, lane, k_lo, k_hi);
  const QueryWindow window = query_window<kBlockN, kSegments>(a, b, n0);

  float dk[kTilesDPerWarp][4], dv[kTilesDPerWarp][4];
#pragma unroll
  for (int j = 0; j < kTilesDPerWarp; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;

  const float scale_log2 = a.scale * kLog2e, keep_scale = 1.0f / (1.0f - a.dropout_prob);
  const int key_row = key_tile * 16 + lane / 4;  // this thread's keys: key_row and key_row + 8 of the block
  // kDropout: those two keys' word folded (dropout_key_word, mix32_fold; the block's keys pair up from n0, a multiple
  // of 16, and key_row's bit 3 is clear), and the threshold as the pair form compares it.
  // kExtras: likewise where the keys pair up (dropout_pairs_keyed), the rows' keys formed per pair.
  [[maybe_unused]] uint32_t key_word = 0, threshold_high = 0;
  [[maybe_unused]] const bool keyed = kExtras && dropout_pairs_keyed(a);
  if (kDropout || keyed) {
    key_word = mix32_fold(dropout_key_word(n0 + key_row < a.kv_len ? a.pos.k[n0 + key_row] : 0));
    threshold_high = dropout_threshold_high(dropout_threshold(a.dropout_prob));
  }
  // The steps are the (query head, query block) pairs whose positions can see these keys, in order;
  // a step's Q, dO, LSE and delta load while the previous step computes (two buffers).
  auto find_step = [&](int& h, int& m0, BlockKind& kind) {
    return next_visible_step<kBlockM, kBlockN, kSegments, Positions::kRead>(a, b, kh, n0, k_lo, k_hi, window, lane, h, m0, kind);
  };
  auto load_step = [&](int buffer, int h, int m0) {
    load_rows<T, D, kBlockM, kThreads, kPadded>(q_buffers + buffer * kBlockM * D, a.q, b, h, m0, a.q_len, a.head_dim,
                                                tid, swz);
    load_rows<T, D, kBlockM, kThreads, kPadded>(do_buffers + buffer * kBlockM * D, g.d_o, b, h, m0, a.q_len,
                                                a.value_dim, tid, swz);
    if (tid < kBlockM) {  // 4-byte copies: rows of a (batch, head) need not be 16-byte aligned
      const int row = m0 + tid;
      const int64_t at = (int64_t(b) * a.q_heads + h) * a.q_len + (row < a.q_len ? row : 0);
      copy_4(&lse_buffers[buffer][tid], g.lse + at, row < a.q_len);
      copy_4(&delta_buffers[buffer][tid], g.delta + at, row < a.q_len);
    }
    if constexpr (!kExtras) load_step_segments<kBlockM, kSegments>(a, segment_buffers[buffer], b, m0, tid);
    if constexpr (kDropout) {
      if (tid < kBlockM) drop_key_buffers[buffer][tid] = dropout_folded_row_key_at(a, b, h, m0 + tid);
    }
  };
  int h = kh * group, m0 = 0, buffer = 0;
  BlockKind kind = BlockKind::kSkip;
  bool have = find_step(h, m0, kind);
  if (have) load_step(0, h, m0);
  copy_commit();
  while (have) {
    int next_h = h, next_m0 = m0 + kBlockM;
    BlockKind next_kind = BlockKind::kSkip;
    const bool next = find_step(next_h, next_m0, next_kind);
    copy_wait_all();
    __syncthreads();  // this step's tiles are in; every warp is done with the other buffer, ds_s and p_s
    if (next) load_step(1 - buffer, next_h, next_m0);
    copy_commit();
    {
      const T* q_s = q_buffers + buffer * kBlockM * D;
      const T* do_s = do_buffers + buffer * kBlockM * D;
      const float* lse_s = lse_buffers[buffer];
      const float* delta_s = delta_buffers[buffer];

      // S^T and dP^T: this warp's 16 keys x its kQTilesPerWarp * 8 queries.
      float st[kQTilesPerWarp][4], dpt[kQTilesPerWarp][4];
#pragma unroll
      for (int j = 0; j < kQTilesPerWarp; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kf[4], vf[4];
        const int ar = key_tile * 16 + (mi % 2) * 8 + lane % 8, ac = kk * 2 + mi / 2;
        ldmatrix_x4(kf, k_s + swizzled<D>(ar, ac));
        ldmatrix_x4(vf, v_s + swizzled<D>(ar, ac));
#pragma unroll
        for (int j = 0; j < kQTilesPerWarp; j += 2) {
          uint32_t qf[4], df[4];
          const int br = (q_tile0 + j + mi / 2) * 8 + lane % 8, bc = kk * 2 + mi % 2;
          ldmatrix_x4(qf, q_s + swizzled<D>(br, bc));
          ldmatrix_x4(df, do_s + swizzled<D>(br, bc));
          mma_16816<T>(st[j], kf, qf[0], qf[1]);
          mma_16816<T>(st[j + 1], kf, qf[2], qf[3]);
          mma_16816<T>(dpt[j], vf, df[0], df[1]);
          mma_16816<T>(dpt[j + 1], vf, df[2], df[3]);
        }
      }

      // P^T (after dropout, into st) and dS^T times the soft cap's derivative (into dpt).
      [[maybe_unused]] const DropoutRows drop = kExtras ? dropout_rows(a, b, h) : DropoutRows{};
      const bool masked = kind == BlockKind::kPartial || kExtras || n0 + kBlockN > a.kv_len || m0 + kBlockM > a.q_len;
#pragma unroll
      for (int j = 0; j < kQTilesPerWarp; ++j) {
        [[maybe_unused]] uint32_t drop_bits[2];  // query column e & 1's dropout_pair_bits (its keys 0 and 1)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n0 + key_row + (e >= 2 ? 8 : 0), qcol = (q_tile0 + j) * 8 + (lane % 4) * 2 + (e & 1);
          const int query = m0 + qcol;
          float s_log2 = st[j][e] * scale_log2, derivative = 1.0f;
          if constexpr (kSoftCap) {
            const float th = soft_cap_tanh(st[j][e] * a.scale / a.soft_cap);
            s_log2 = a.soft_cap * kLog2e * th, derivative = 1.0f - th * th;
          }
          if (masked) {
            if (key >= a.kv_len || query >= a.q_len) {
              s_log2 = -INFINITY;
            } else if constexpr (kExtras) {
              const float logit = pair_logit_cuda(a, st[j][e], b, h, query, key, a.pos.q[query], a.pos.k[key]);
              s_log2 = logit * kLog2e;
              if (a.soft_cap > 0.0f) {
                const float th = soft_cap_tanh(st[j][e] * a.scale / a.soft_cap);
                derivative = 1.0f - th * th;
              }
            } else if (!position_visible(a.pos.q[query], a.pos.k[key], a.causal, a.window_left, a.window_right) ||
                       !same_segment<kSegments>(a, segment_buffers[buffer], qcol, b, key)) {
              s_log2 = -INFINITY;
            }
          }
          // LSE in log2 units; a row that saw nothing (-inf) or is past the end gives P = 0.
          const float lse = lse_s[qcol];
          const float p = query < a.q_len && lse != -INFINITY ? fast_exp2(s_log2 - lse * kLog2e) : 0.0f;
          float weight = 1.0f;
          if constexpr (kDropout)
            weight = dropout_pair_weight(drop_bits, e, drop_key_buffers[buffer][qcol], key_word, threshold_high,
                                         keep_scale);
          if constexpr (kExtras) {
            if (keyed)  // a query's row key for its key row_key's finalizer (e < 2), read again for key + 8
              weight = dropout_pair_weight(drop_bits, e, e < 2 ? drop.folded_row_key(query < a.q_len ? a.pos.q[query] : 0) : 0u,
                                           key_word, threshold_high, keep_scale);
            else if (p > 0.0f)
              weight = drop.weight(drop.row_key(a.pos.q[query]), a.pos.k[key]);
          }
          const float ds = p * (dpt[j][e] * weight - (query < a.q_len ? delta_s[qcol] : 0.0f));
          if (kExtras && g.dbias.data && p > 0.0f) add_dbias(g, b, h, query, a.pos.k[key], ds);
          st[j][e] = p * weight;
          dpt[j][e] = ds * derivative;
        }
      }

      // dS^T (and P^T where a warp holds half its rows) to shared memory, 16-bit, rows of 64 queries:
      // before dV and dK where those read them from there, else after.
      auto store_rows = [&](T* dst, const float (&frag)[kQTilesPerWarp][4]) {
#pragma unroll
        for (int j = 0; j < kQTilesPerWarp; ++j)
#pragma unroll
          for (int i = 0; i < 2; ++i)
            *reinterpret_cast<uint32_t*>(dst + swizzled<kBlockM>(key_row + i * 8, q_tile0 + j) + (lane % 4) * 2) =
                pack2<T>(frag[j][2 * i], frag[j][2 * i + 1]);
      };
      if constexpr (Traits::kPInShared) {
        store_rows(ds_s, dpt);
        store_rows(p_s, st);
        __syncthreads();
      }

      // dV += P^T dO and dK += dS^T Q over this warp's columns (dO and Q through transposing ldmatrix:
      // queries are the k axis). P^T and dS^T come from registers, or from shared memory where split.
#pragma unroll
      for (int kc = 0; kc < kBlockM / 16; ++kc) {
        uint32_t pf[4], sf[4];
        if constexpr (Traits::kPInShared) {
          const int r = key_tile * 16 + (mi % 2) * 8 + lane % 8, c = kc * 2 + mi / 2;
          ldmatrix_x4(pf, p_s + swizzled<kBlockM>(r, c));
          ldmatrix_x4(sf, ds_s + swizzled<kBlockM>(r, c));
        } else {
          pack_probabilities<T>(st, kc, pf);
          pack_probabilities<T>(dpt, kc, sf);
        }
#pragma unroll
        for (int j = 0; j < kTilesDPerWarp; j += 2) {
          uint32_t of[4], qf[4];
          const int r = kc * 16 + (mi % 2) * 8 + lane % 8, c = d_tile0 + j + mi / 2;
          ldmatrix_x4_trans(of, do_s + swizzled<D>(r, c));
          ldmatrix_x4_trans(qf, q_s + swizzled<D>(r, c));
          mma_16816<T>(dv[j], pf, of[0], of[1]);
          mma_16816<T>(dv[j + 1], pf, of[2], of[3]);
          mma_16816<T>(dk[j], sf, qf[0], qf[1]);
          mma_16816<T>(dk[j + 1], sf, qf[2], qf[3]);
        }
      }

      if constexpr (!Traits::kPInShared) {  // measured: after dV and dK here (4% at D = 64), before them where split
        store_rows(ds_s, dpt);
        __syncthreads();
      }

      // dQ: warp w forms rows of query tile w % 4, the half w / 4 of D (accumulators beside dK's and dV's).
      constexpr int kHalf = D / 16;
      const int q_tile = warp % (kBlockM / 16), half = warp / (kBlockM / 16);
      float dq[kHalf][4];
#pragma unroll
      for (int j = 0; j < kHalf; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[j][e] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < kBlockN / 16; ++kc) {
        uint32_t af[4];
        ldmatrix_x4_trans(af, ds_s + swizzled<kBlockM>(kc * 16 + (mi / 2) * 8 + lane % 8, q_tile * 2 + mi % 2));
#pragma unroll
        for (int j = 0; j < kHalf; j += 2) {
          uint32_t kf[4];
          ldmatrix_x4_trans(kf, k_s + swizzled<D>(kc * 16 + (mi % 2) * 8 + lane % 8, half * kHalf + j + mi / 2));
          mma_16816<T>(dq[j], af, kf[0], kf[1]);
          mma_16816<T>(dq[j + 1], af, kf[2], kf[3]);
        }
      }
      add_dq_rows<kPadded, kHalf>(g, dq, b, h, m0 + q_tile * 16 + lane / 4, half * kHalf * 8, lane);
    }
    h = next_h;
    m0 = next_m0;
    kind = next_kind;
    have = next;
    buffer = 1 - buffer;
  }
  copy_wait_all();

  add_dk_dv_rows<T, kPadded>(g, dk, dv, b, kh, n0 + key_row, d_tile0 * 8, lane);
}

template <typename T, int D, bool kPadded>
void launch_backward(const FlashBackwardArgs& g, Tensor* dq_slices, cudaStream_t stream) {
  using Traits = BackwardTraits<T, D>;
  // The extras and soft-cap instances always read segment ids (the extras are not at the register limit's edge;
  // the soft cap is rare enough not to double its instances).
  auto kernel = flash_takes_dropout_beside_positions(g.a) ? flash_backward_kernel<T, D, false, true, kPadded, false, true>
                : flash_has_extras(g.a)   ? flash_backward_kernel<T, D, true, true, kPadded>
                : g.a.soft_cap > 0.0f  ? flash_backward_kernel<T, D, false, true, kPadded, true>
                : g.a.q_segment_ranges ? flash_backward_kernel<T, D, false, true, kPadded>
                                       : flash_backward_kernel<T, D, false, false, kPadded>;
  launch_flash_backward(reinterpret_cast<const void*>(kernel), g, Traits::kBlockN, kThreads, Traits::kSmemBytes,
                        dq_slices, stream);
}

}  // namespace

void launch_flash_backward(const void* kernel, FlashBackwardArgs g, int block_n, int threads, size_t smem,
                           Tensor* dq_slices, cudaStream_t stream) {
  RA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int key_blocks = int((g.a.kv_len + block_n - 1) / block_n);
  const int64_t heads = int64_t(g.a.batch) * g.a.kv_heads;
  const int64_t slice = int64_t(g.a.batch) * g.a.q_len * g.a.q_heads * g.a.head_dim;
  auto launch = [&](int blocks) {
    const dim3 grid(unsigned(blocks), unsigned(g.a.kv_heads), unsigned(g.a.batch));
    void* args[] = {&g};
    RA_CUDA_CHECK(cudaLaunchKernel(kernel, grid, dim3(unsigned(threads)), args, smem, stream));
  };
  if (dq_slices == nullptr) return launch(key_blocks);
  // A round: as many blocks per (batch, K/V head) as fill the GPU once (a second, part-filled wave would
  // cost a whole one), at most kMaxDqSlices; a function of the shapes and the GPU alone, so the order of
  // the sums is the same on every run.
  int per_sm = 0, device = 0, sms = 0;
  RA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  RA_CUDA_CHECK(cudaGetDevice(&device));
  RA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int round = int(std::clamp<int64_t>(int64_t(sms) * std::max(per_sm, 1) / heads, 1,
                                            std::min(kMaxDqSlices, key_blocks)));
  float* accumulator = g.dq;
  if (round > 1) {  // one round of one block per (batch, K/V head) adds to the accumulator itself
    const size_t bytes = size_t(round) * size_t(slice) * sizeof(float);
    g.dq = call_scratch(*dq_slices, bytes, stream, "the deterministic backward's dQ slices").data_as<float>();
    RA_CUDA_CHECK(cudaMemsetAsync(g.dq, 0, bytes, stream));
    g.dq_slice_size = slice;
  }
  for (g.first_key_block = 0; g.first_key_block < key_blocks; g.first_key_block += round)
    launch(std::min(round, key_blocks - g.first_key_block));
  if (round == 1) return;
  add_slices_cuda(accumulator, g.dq, round, slice, stream);
}

void check_flash_backward_cuda_supported(const AttentionInputs& in, const BackwardInputs& grad, const GradViews& acc) {
  const DType dt = in.q.dtype();
  check_flash_head_dims(in.q.dim(3), in.v.dim(3), "the cuda flash_attn2 backward");
  RA_CHECK(grad.d_o.dtype() == dt, "do has dtype ", dtype_name(grad.d_o.dtype()), ": the cuda flash_attn2 backward "
           "needs it in q's dtype ", dtype_name(dt), " (tensor-core operands)");
  const TensorView& d_o = grad.d_o;
  const bool aligned = d_o.stride(3) == 1 && d_o.stride(0) % 8 == 0 && d_o.stride(1) % 8 == 0 && d_o.stride(2) % 8 == 0 &&
                       reinterpret_cast<uintptr_t>(d_o.data()) % 16 == 0;
  RA_CHECK(aligned, "do must have a contiguous last dimension and 16-byte aligned rows for the cuda flash_attn2 backward");
  for (auto [t, name] : {std::pair{&acc.dq, "dq"}, std::pair{&acc.dk, "dk"}, std::pair{&acc.dv, "dv"}})
    RA_CHECK(t->dtype() == DType::kF32 && t->is_contiguous(), "the ", name, " accumulator must be contiguous f32");
}

void flash_backward_cuda(const FlashBackwardArgs& args, DType dtype, Tensor* dq_slices, cudaStream_t stream) {
  if (args.a.q_len == 0 || args.a.kv_len == 0) return;
  FlashBackwardArgs g = args;
  const SegmentRanges segments(g.a, stream);
  find_dropout_key_pairing(g.a);
  if (flash_uses_wgmma(g.a)) return flash_wgmma_backward(g, dtype, dq_slices, stream);
  dispatch_half_dtype(dtype, "the cuda flash_attn2 backward", [&](auto element) {
    // Exact head dims of 64 and 128 run the padded instance, measured 0.99-1.00x the exact ones; at 256 the exact
    // one is 1.02-1.03x faster (H100, T = 32768, bf16: bench/RESULTS.md).
    dispatch_flash_instance<256>(g.a.head_dim, g.a.value_dim, "the cuda flash_attn2 backward", [&](auto instance, auto padded) {
      launch_backward<decltype(element), decltype(instance)::value, decltype(padded)::value>(g, dq_slices, stream);
    });
  });
}

}  // namespace ra
