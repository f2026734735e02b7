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
#include "attention/ring/ring.h"
#include "runtime/cuda_device.h"

namespace ra {

class PeerCopyRing;

class RingAttentionCuda final : public CudaAttentionImpl {
 public:
  // Collective over the ring when it may use copy engines (it asks every rank whether they can).
  explicit RingAttentionCuda(RingContext ctx);
  ~RingAttentionCuda() override;
  std::string_view name() const override { return "ring"; }
  int64_t max_head_dim() const override { return local_->max_head_dim(); }
  void set_cuda_stream(void* stream) override;
  void check_supported(const AttentionInputs& in, const AttentionParams& params) const override {
    local_->check_supported(in, params);
  }
  void accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                  Carry& carry) const override;
  void accumulate_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                         Carry& carry) const override;
  // The last call's statistics; its per-step device times once the caller has waited for the device.
  const RingStats& last_stats() const;

 private:
  // Both entry points: `entered` is when the caller's call began (RingStats' host times).
  void run(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params, Carry& carry,
           std::chrono::steady_clock::time_point entered) const;
  RingContext ctx_;
  std::unique_ptr<CudaAttentionImpl> local_;
  // From the layout alone, fixed for this ring: this rank's query positions (block skipping) and each
  // rank's key positions (block skipping; cudnn splits blocks by them).
  std::vector<int64_t> query_positions_;
  int64_t q_lo_ = 0, q_hi_ = -1;
  std::vector<std::vector<int64_t>> source_keys_;
  std::vector<int64_t> key_offsets_;  // where each rank's keys start in the uploaded positions
  bool source_keys_sorted_ = true;  // each rank's block ascending (their concatenation need not be)
  // accumulate()'s upload (the caller's query positions, then every rank's keys), sent again only when
  // the caller's query positions change: the host work per call stays off the device's critical path.
  mutable std::vector<int64_t> uploaded_q_;
  mutable DevicePositions uploaded_;
  mutable RingStats stats_;
  // Reused across calls (grow-only): a cudaMalloc / cudaFree pair per call costs milliseconds and
  // cudaFree stalls the device. `blocks_free_` marks the last compute that read the blocks.
  mutable Tensor blocks_, checks_;
  mutable std::unique_ptr<CudaEvent> blocks_free_;  // made on first use (constructing needs no GPU)
  mutable std::unique_ptr<CudaStream> check_stream_;  // checksums of arriving blocks; made on first use
  // RingContext::time_steps: per step, compute start / end on the compute stream and exchange start
  // / end on the communicator's stream (`which` 0-3 of step_event).
  mutable std::vector<std::unique_ptr<CudaEvent>> step_events_;
  CudaEvent* step_event(int step, int which) const;
  mutable bool step_times_pending_ = false;  // the last call's events are not yet read into stats_
  // Copy engines: chosen in the constructor; the next rank's block buffers mapped here once they exist.
  bool copy_engines_ = false;
  mutable std::unique_ptr<PeerCopyRing> peers_;
};

}  // namespace ra
