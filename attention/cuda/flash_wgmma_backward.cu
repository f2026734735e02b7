// FlashAttention's backward on Hopper's warpgroup MMA (sm_90a), for the options that only look at
// positions and segment ids. A block of two warpgroups owns 128 keys of one (batch, K/V head), 64 per warpgroup, and
// walks the blocks of query rows of every query head of its group that can see them, as the mma.sync
// backward does. Keys are the M axis of S^T = K Q^T and dP^T = V dO^T (both operands in shared
// memory), so P^T and dS^T come out of the tensor cores in the register layout of wgmma's A operand:
// dV += P^T dO and dK += dS^T Q take them from registers, with dO and Q read MN-major from shared
// memory, and dK / dV stay in registers for the whole walk. dS^T goes to shared memory once for
// dQ = dS K, of which each warpgroup forms 64 x 64 (both operands MN-major) before dV and dK, added to
// the f32 accumulator with 16-byte atomics while the tensor cores form those (the atomics bound the
// kernel; staging dQ for the TMA unit's bulk reductions measured no faster, per row or as tiles). The next
// step's Q and dO load by TMA (one thread starts them; 1.03-1.14x the per-thread copies, which cost this
// register-bound kernel its spills), its LSE and delta by plain loads, while this one computes. At D = 256 dK and dV of 64 keys x 256 do not
// fit a warpgroup's registers: both warpgroups share 64 keys, each forms S^T / dP^T for half of the query
// block and owns half of D of dK, dV and dQ, and P^T joins dS^T in shared memory, from where dV and dK
// take their A operand. D = 32, 96 and 192 have instances of their own (FlashAttention-2's head dims), their
// Q, dO, K and V in slabs of 32 columns so that every warpgroup's share of D covers whole slabs. At exact
// D = 192 and 256 on positions, where the atomics cost nearly half the kernel, dQ comes from a query-block kernel of
// its own instead (flash_wgmma_backward_dq.cu).
#include "attention/cuda/flash_wgmma_backward.h"

#include <algorithm>
#include <optional>

#include "attention/cuda/dispatch.cuh"
#include "attention/cuda/flash_wgmma_backward_kernel.cuh"
#include "attention/cuda/mask_tiles.h"
#include "runtime/cuda_device.h"

namespace ra {
namespace {

using namespace wgmma_backward;

template <typename T, int D, bool kPadded, bool kSegments, bool kSoftCap, bool kExtras, bool kBias = false,
          bool kMask = false, bool kDropout = false>
void launch_instance(const FlashBackwardArgs& g, Tensor* dq_slices, cudaStream_t stream) {
  using Traits = WgmmaBackwardTraits<T, D, kExtras, kBias, kMask>;
  auto kernel =
      flash_wgmma_backward_kernel<T, D, kSegments, kSoftCap, kExtras, kPadded, false, false, kBias, kMask, kDropout>;
  FlashBackwardArgs with = with_step_maps<T, Traits>(g);
  std::optional<MaskTiles> mask_tiles;  // the mask instance's summary of the mask
  if constexpr (kMask) mask_tiles.emplace(with.a, stream);
  launch_flash_backward(reinterpret_cast<const void*>(kernel), with, Traits::kBlockN, kThreads, Traits::kSmemBytes,
                        dq_slices, stream);
}

template <typename T, int D, bool kPadded>
void launch(const FlashBackwardArgs& g, Tensor* dq_slices, cudaStream_t stream) {
  // The extras spill at D = 96 (beside unsplit dK and dV, 324 bytes a thread) and 32 (760): the 128 instance's
  // split layout and the 64 instance, as before those had instances of their own.
  // A bias, alone or beside dropout, at exact D = 64 and 128 (the common head dims) has an instance of its own: the
  // positions' kernel with the bias staged in shared memory, unsplit, where the extras instance reads it per pair; a
  // mask likewise.
  if constexpr ((D == 64 || D == 128) && !kPadded) {
    const bool dropout = g.a.dropout_prob > 0.0f;
    if (flash_takes_bias_instance(g.a))
      return dropout ? launch_instance<T, D, false, false, false, false, true, false, true>(g, dq_slices, stream)
                     : launch_instance<T, D, false, false, false, false, true>(g, dq_slices, stream);
    if (flash_takes_mask_instance(g.a))
      return dropout ? launch_instance<T, D, false, false, false, false, false, true, true>(g, dq_slices, stream)
                     : launch_instance<T, D, false, false, false, false, false, true>(g, dq_slices, stream);
  }
  // Dropout beside positions and segment ids: its own instance at 64, 128 and 256 (dQ formed beside dK and dV, as the
  // extras form it).
  if constexpr ((D == 64 || D == 128 || D == 256) && !kPadded) {
    if (flash_takes_dropout_beside_positions(g.a))
      return g.a.q_segment_ranges ? launch_instance<T, D, false, true, false, false, false, false, true>(g, dq_slices, stream)
                                  : launch_instance<T, D, false, false, false, false, false, false, true>(g, dq_slices, stream);
  }
  if (flash_has_extras(g.a)) {
    constexpr int kExtrasD = D == 96 ? 128 : D == 32 ? 64 : D;
    return launch_instance<T, kExtrasD, kPadded || kExtrasD != D, true, false, true>(g, dq_slices, stream);
  }
  if (g.a.soft_cap > 0.0f)
    return g.a.q_segment_ranges ? launch_instance<T, D, kPadded, true, true, false>(g, dq_slices, stream)
                                : launch_instance<T, D, kPadded, false, true, false>(g, dq_slices, stream);
  if (g.a.q_segment_ranges) return launch_instance<T, D, kPadded, true, false, false>(g, dq_slices, stream);
  launch_instance<T, D, kPadded, false, false, false>(g, dq_slices, stream);
}

}  // namespace

bool flash_wgmma_backward_orders_dq(const CudaAttentionArgs& a) {
  const int widest = std::max(a.head_dim, a.value_dim);
  return widest <= 64 || widest > 128 || flash_has_extras(a);
}

void flash_wgmma_backward(const FlashBackwardArgs& g, DType dtype, Tensor* dq_slices, cudaStream_t stream) {
  if (flash_wgmma_backward_dq_apart(g.a)) return flash_wgmma_backward_with_dq_apart(g, dtype, stream);
  // --deterministic: dQ's adds in a fixed order (no copies of dQ) where measured faster than slices.
  if (dq_slices != nullptr && flash_wgmma_backward_orders_dq(g.a))
    return flash_wgmma_backward_ordered(g, dtype, dq_slices, stream);
  dispatch_half_dtype(dtype, "the wgmma flash_attn2 backward", [&](auto element) {
    dispatch_flash_instance_of<InstanceDims<32, 64, 96, 128, 192, 256>, 64, 128, 256>(
        g.a.head_dim, g.a.value_dim, "the wgmma flash_attn2 backward", [&](auto instance, auto padded) {
      launch<decltype(element), decltype(instance)::value, decltype(padded)::value>(g, dq_slices, stream);
    });
  });
}

}  // namespace ra
