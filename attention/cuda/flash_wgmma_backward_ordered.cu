// --deterministic on the wgmma flash backward: the same bits on every run without copies of dQ. Every key
// block's adds into a block of query rows are ordered: the key blocks that reach it add one after the
// other, from the last down (FlashAttention-3's order for the deterministic backward). The key blocks
// launch in that order too (block x of the grid holds key block N - 1 - x), so a block only ever waits for
// blocks that started before it: along a causal or sliding-window diagonal the key block above a block's
// first query block has not reached it yet and is not waited for, and the adds form a pipeline rather
// than a chain.
//
// Who adds where is the backward's own walk (next_visible_step), run first by a small kernel that marks,
// per block of query rows, the key blocks that reach it; a key block's rank there is the count of marked
// blocks above it, and it adds on the counter's reaching that rank (DqTurn in flash_backward_rows.cuh).
// The ordered kernel is its own template instance: the default one compiles as before.
#include <cuda_runtime.h>

#include "attention/cuda/dispatch.cuh"
#include "attention/cuda/flash_wgmma_backward.h"
#include "attention/cuda/flash_wgmma_backward_kernel.cuh"
#include "runtime/cuda_device.h"
#include "runtime/graph_capture.h"
#include "runtime/memory.h"

namespace ra {
namespace {

using namespace wgmma_backward;

// Marks the key blocks whose walk reaches each block of query rows (one warp per key block; the first query
// head of the group: every head of it walks the same rows).
template <int kBlockM, int kBlockN, bool kSegments>
__global__ void __launch_bounds__(32) mark_dq_writers(const FlashBackwardArgs g, uint32_t* writers) {
  const CudaAttentionArgs& a = g.a;
  const int lane = threadIdx.x, block = blockIdx.x, kh = blockIdx.y, b = blockIdx.z, n0 = block * kBlockN;
  int64_t k_lo, k_hi;
  tile_key_range<kBlockN>(a, block, lane, k_lo, k_hi);
  const QueryWindow window = query_window<kBlockN, kSegments>(a, b, n0);
  const int first_head = kh * (a.q_heads / a.kv_heads);
  int h = first_head, m0 = 0;
  BlockKind kind;
  while (next_visible_step<kBlockM, kBlockN, kSegments>(a, b, kh, n0, k_lo, k_hi, window, lane, h, m0, kind) &&
         h == first_head) {
    if (lane == 0)
      atomicOr(writers + ((int64_t(b) * a.kv_heads + kh) * g.q_blocks + m0 / kBlockM) * g.dq_writer_words + block / 32,
               1u << (block % 32));
    m0 += kBlockM;
  }
}

// Per row of writer words, the count of set bits in the words after each.
__global__ void count_writers_after(const uint32_t* writers, int* after, int64_t rows, int words) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  int count = 0;
  for (int w = words - 1; w >= 0; --w) {
    after[row * words + w] = count;
    count += __popc(writers[row * words + w]);
  }
}

template <typename T, int D, bool kPadded, bool kSegments, bool kSoftCap, bool kExtras>
void launch_ordered(FlashBackwardArgs g, Tensor* scratch, cudaStream_t stream) {
  using Traits = WgmmaBackwardTraits<T, D, kExtras>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  const CudaAttentionArgs& a = g.a;
  const int key_blocks = (a.kv_len + kBlockN - 1) / kBlockN;
  g.q_blocks = (a.q_len + kBlockM - 1) / kBlockM;
  g.dq_writer_words = (key_blocks + 31) / 32;
  const int64_t turns = int64_t(a.batch) * a.q_heads * g.q_blocks, rows = int64_t(a.batch) * a.kv_heads * g.q_blocks;
  const int64_t cells = rows * g.dq_writer_words;
  int* turn_counters = call_scratch(*scratch, size_t(turns + 2 * cells) * sizeof(int), stream,
                                    "the deterministic backward's dQ turns").data_as<int>();
  uint32_t* writers = reinterpret_cast<uint32_t*>(turn_counters + turns);
  int* writers_after = reinterpret_cast<int*>(writers + cells);
  RA_CUDA_CHECK(cudaMemsetAsync(turn_counters, 0, size_t(turns + cells) * sizeof(int), stream));
  mark_dq_writers<kBlockM, kBlockN, kSegments>
      <<<dim3(unsigned(key_blocks), unsigned(a.kv_heads), unsigned(a.batch)), 32, 0, stream>>>(g, writers);
  RA_CUDA_CHECK(cudaGetLastError());
  count_writers_after<<<unsigned((rows + 255) / 256), 256, 0, stream>>>(writers, writers_after, rows, g.dq_writer_words);
  RA_CUDA_CHECK(cudaGetLastError());
  g.dq_turns = turn_counters;
  g.dq_writers = writers;
  g.dq_writers_after = writers_after;
  g.first_key_block = 0;
  g.dq_slice_size = 0;
  auto kernel = flash_wgmma_backward_kernel<T, D, kSegments, kSoftCap, kExtras, kPadded, true>;
  launch_flash_backward(reinterpret_cast<const void*>(kernel), with_step_maps<T, Traits>(g), kBlockN, kThreads,
                        Traits::kSmemBytes, nullptr, stream);
}

// Only the instances flash_wgmma_backward_orders_dq sends here: at 128 columns the extras one alone.
template <typename T, int D, bool kPadded>
void launch(const FlashBackwardArgs& g, Tensor* scratch, cudaStream_t stream) {
  if (flash_has_extras(g.a)) return launch_ordered<T, D, kPadded, true, false, true>(g, scratch, stream);
  if constexpr (D != 128) {
    if (g.a.soft_cap > 0.0f)
      return g.a.q_segment_ranges ? launch_ordered<T, D, kPadded, true, true, false>(g, scratch, stream)
                                  : launch_ordered<T, D, kPadded, false, true, false>(g, scratch, stream);
    if (g.a.q_segment_ranges) return launch_ordered<T, D, kPadded, true, false, false>(g, scratch, stream);
    return launch_ordered<T, D, kPadded, false, false, false>(g, scratch, stream);
  }
  RA_FAIL("the ordered wgmma backward has no instance for 128 columns without bias, mask or dropout "
          "(flash_wgmma_backward_orders_dq sends those to the dQ slices)");
}

}  // namespace

void flash_wgmma_backward_ordered(const FlashBackwardArgs& g, DType dtype, Tensor* scratch, cudaStream_t stream) {
  dispatch_half_dtype(dtype, "the wgmma flash_attn2 backward", [&](auto element) {
    dispatch_flash_instance<64, 128, 256>(g.a.head_dim, g.a.value_dim, "the wgmma flash_attn2 backward",
                                          [&](auto instance, auto padded) {
      launch<decltype(element), decltype(instance)::value, decltype(padded)::value>(g, scratch, stream);
    });
  });
}

}  // namespace ra
