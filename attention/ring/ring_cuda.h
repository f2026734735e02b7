// `ring` on GPUs: the same schedule as the host ring (attention/ring/ring.h), with K/V double-buffered in
// device memory, the local kernel on the compute stream and the transfer (NCCL send/recv, or copy
// engines over CUDA IPC) on the communicator's stream, ordered by events, so that step i's compute
// overlaps step i+1's transfer. Step 0 computes on the rank's own k and v while they leave for the
// first exchange (as pieces over copy engines, packed into a buffer for NCCL; queued after that
// kernel, so the device starts computing as early as the host can launch). Device memory per rank is
// the rank's Q, the carry, and two K/V blocks: O(T / N).
#pragma once

#include <chrono>

#include "attention/cuda/cuda_attention.h"
#include "attention/ring/device_spans.h"
#include "attention/ring/kv_rotation_cuda.h"
#include "attention/ring/ring.h"
#include "runtime/cuda_device.h"

namespace ra {

class RingAttentionCuda final : public CudaAttentionImpl {
 public:
  // Collective over the ring: it chooses the channel (copy engines where every rank can use them).
  // The sequence axis is NCCL, or MPI where copy engines carry the blocks (ranks sharing a GPU).
  explicit RingAttentionCuda(RingContext ctx);
  ~RingAttentionCuda() override;
  std::string_view name() const override { return "ring"; }
  int64_t max_head_dim() const override { return local_->max_head_dim(); }
  bool takes_flash_kernel() const override { return local_->takes_flash_kernel(); }
  void set_cuda_stream(void* stream) override;
  // The local kernel's support checks, before the call's start: a rank refusing joins its agreement.
  void check_supported(const AttentionInputs& in, const AttentionParams& params) const override {
    check_alike([&] { local_->check_supported(in, params); });
  }
  void accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                  Carry& carry) const override;
  void accumulate_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                         Carry& carry) const override;
  // The backward (attention/ring/ring_cuda_backward.cc): K/V rotate as in the forward while each
  // block's f32 dK/dV accumulator travels one step behind it, each other rank adding its part (computed
  // into a zeroed partial while the accumulator is in flight), checksummed by every sender and checked
  // on arrival; a last hop brings every accumulator home, hidden by the owner's own block. dQ stays local; dsinks and the dbias of a bias
  // shared by every rank's rows are summed over the ring.
  bool has_backward() const override { return local_->has_backward(); }
  bool backward_reads_output() const override { return local_->backward_reads_output(); }
  void check_backward_supported(const AttentionInputs& in, const AttentionParams& params) const override {
    check_alike([&] { local_->check_backward_supported(in, params); });
  }
  void accumulate_backward_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                                  const BackwardInputs& grad, const GradViews& acc) const override;
  void reduce_sequence_gradients(Gradients& g) const override;
  void refuse_call(const std::exception_ptr& refused) const override;  // ring_call_start.h
  // A ring of one rank is its local kernel: cudnn then writes the gradients straight, without f32
  // accumulators. A longer ring (without a bias) converts each gradient once, dK / dV with the last hop's
  // accumulator added in the same pass.
  bool backward_into(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                     const BackwardInputs& grad, Gradients& out, const GradViews* into) const override;

  // The last call's statistics; its per-step device times once the caller has waited for the device.
  const RingStats& last_stats() const;

 private:
  // Both entry points: `entered` is when the caller's call began (RingStats' host times).
  void run(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params, Carry& carry,
           std::chrono::steady_clock::time_point entered) const;
  // This rank's query positions and every rank's keys on the device (uploaded when they change).
  const DevicePositions& ring_positions_on_device(const TokenPositions& pos) const;
  DevicePositions device_positions(const TokenPositions& pos) const override { return ring_positions_on_device(pos); }
  // Rank `source`'s block of the keys in `pos` (the ring's positions on the device): its device positions, the
  // layout's host copies of this rank's queries and its keys, and whether its keys pair up for dropout.
  DevicePositions block_positions(const DevicePositions& pos, int source) const;
  void check_shard_rows(const AttentionInputs& in) const;  // this rank's shard has the layout's rows
  // The backward's ring into the f32 accumulators `acc`; with `out` (q's dtype or f32, contiguous; more
  // than one rank) the last hop's dK / dV land there, the own block's parts in `acc` added in the same pass.
  void backward_steps(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                      const BackwardInputs& grad, const GradViews& acc, const GradViews* out) const;
  RingContext ctx_;
  // From the layout alone, fixed for this ring: this rank's query positions and each rank's key
  // positions (block skipping; the kernels' masks; cudnn splits blocks by them).
  RingSchedule schedule_;
  std::unique_ptr<CudaAttentionImpl> local_;
  // accumulate()'s upload (the caller's query positions, then every rank's keys), sent again only when
  // the caller's query positions change: the host work per call stays off the device's critical path.
  mutable std::vector<int64_t> uploaded_q_;
  mutable DevicePositions uploaded_;
  mutable RingStats stats_;
  mutable bool started_ = false;  // a call is past its start (RingCallStart)
  // Reused across calls (grow-only): the channel and its window, the checks, the backward's partial
  // dK/dV and the checks of the accumulators that arrived.
  mutable RingDeviceState state_;
  mutable Tensor partial_, gradient_checks_;
  // RingContext::time_steps: per step, compute start / end on the compute stream and exchange start
  // / end on the communicator's stream (`which` 0-3 of step_event).
  mutable std::vector<std::unique_ptr<CudaEvent>> step_events_;
  CudaEvent* step_event(int step, int which) const;
  mutable bool step_times_pending_ = false;  // the last call's events are not yet read into stats_
  mutable DeviceSpans spans_;                 // the backward's, read into stats_ like the step times
};

}  // namespace ra
