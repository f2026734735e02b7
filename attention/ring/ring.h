// The `ring` implementation: sequence-parallel attention over the ranks of one communicator. Each
// rank holds its Q shard and one K/V shard; for N steps it folds its Q against the K/V block it holds
// into the f32 carry with a local kernel (flash_attn2 or sdpa, by name) while the next block is
// already in flight (double-buffered). Blocks that the causal mask or the window leave empty are
// skipped; only the Hkv heads travel; segment ids travel with their block.
#pragma once

#include <chrono>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "attention/attention_impl.h"
#include "attention/ring/ring_schedule.h"
#include "collectives/communicator.h"
#include "mesh/sequence_layout.h"
#include "runtime/fault_injection.h"

namespace ra {

class MpiCommunicator;
struct GradientTrip;

// How the GPU ring moves K/V blocks: NCCL send/recv, or copy engines writing into the next GPU's
// memory over CUDA IPC (one node with peer access; no SMs taken from the local kernel). kAuto: copy
// engines where every rank of the ring can use them, else NCCL.
enum class RingTransport { kAuto, kNccl, kCopyEngines };
RingTransport parse_ring_transport(const std::string& name);  // "auto" | "nccl" | "copy-engines"
const char* ring_transport_name(RingTransport transport);

// The backward's dK/dV accumulators on the wire (RingContext::gradient_wire): "f32" or "bf16"; `option`
// names the setting in the error ("--grad-wire", "grad_wire").
DType parse_gradient_wire(const std::string& text, const char* option);
// Refuses a bf16 wire beside deterministic on the host ring (which sums exactly, in fixed point, on its wire).
void check_ring_modes(bool deterministic, DType gradient_wire, Backend backend);

struct RingContext {
  Communicator* comm = nullptr;                      // the sequence-parallel axis
  SequenceLayout layout = SequenceLayout::kContiguous;
  int64_t global_q_len = 0, global_kv_len = 0;       // T and S of the whole sequence
  std::string local_impl = "flash_attn2";            // the kernel each step calls
  std::chrono::milliseconds step_timeout{60000};     // per-step deadline on the exchange
  // The backward's dK/dV accumulators on the wire: f32 (every hop adds in f32), or bf16 (half the
  // traffic; each hop rounds the running sum to bf16, so the error grows with the ring's size).
  DType gradient_wire = DType::kF32;
  bool verify_blocks = true;  // a checksum of every block in flight, checked on arrival (attention/ring/block_seal.h)
  // Bitwise-identical results for any ring size and layout (host ring): the forward an exact max pass
  // and a fixed-point sum pass (two trips around the ring, scalar kernels; attention/cpu/exact_sum_cpu.h),
  // the backward one trip of fixed-point sums (attention/cpu/exact_backward_cpu.h). The GPU ring: the
  // same bits on every run for this ring size and layout (AttentionParams::deterministic's backward).
  bool deterministic = false;
  // GPU ring: time every step's compute and exchange with CUDA events (RingStats::step_*_ms). A
  // timing event between two kernels keeps the second from starting on the SMs the first leaves idle,
  // so a timed ring runs about 2% slower: for diagnosis, not for the time of a call.
  bool time_steps = false;
  FaultPlan fault;  // the failure tests' plan (the CLI's from RINGATTN_FAULT); none by default
  // GPU ring: the transport, and the sequence axis over MPI (same ranks, same order as `comm`), which
  // carries the copy engines' handshakes; without it the ring uses NCCL.
  RingTransport transport = RingTransport::kAuto;
  MpiCommunicator* host_comm = nullptr;
  // Called after each step (0-based, of `steps`) once its block is folded (host ring) or queued and
  // the next block has arrived (GPU ring): progress lines for long runs. Empty: nothing.
  std::function<void(int step, int steps)> on_step;
};

// Positions of this rank's rows under the layout: its queries, and its own K/V rows.
TokenPositions ring_positions(const RingContext& ctx);

// The context's schedule for this rank (attention/ring/ring_schedule.h).
RingSchedule ring_schedule(const RingContext& ctx);

// Whether the bias is shared by the query rows of every rank (its query-row dimension broadcast), so
// that its gradient is the sum of the ranks' parts; a bias of this rank's rows needs no sum. Collective.
bool bias_shared_over_ring(Communicator& comm, const AttentionInputs& in);

// Where k, v and the kv segment ids sit in a K/V block in flight: k at offset 0, then v, then the
// segment ids (when present), each section sized for `slot_rows` rows (the most any rank holds: shards
// may differ by a row or two) and starting on a multiple of `align` bytes (the host ring packs them
// tight; the GPU ring aligns them for the kernels' row loads). A block of fewer rows sits at the start
// of each section. `payload`: the end of the last section; every block in flight is that long.
struct KvBlockLayout {
  KvBlockLayout(const AttentionInputs& in, int64_t slot_rows, size_t align);
  size_t v_offset = 0, segments_offset = 0, payload = 0;
  struct Span {
    size_t offset, bytes;
  };
  // The bytes of a block of `rows` rows that no section holds: alignment gaps and unused rows.
  std::vector<Span> padding(const AttentionInputs& in, int64_t rows) const;
  // `in` with k, v and (when present) the kv segment ids of a block of `rows` rows at `base`.
  AttentionInputs view(const AttentionInputs& in, char* base, int64_t rows, MemoryKind memory) const;
};

// A span of device time on one of the GPU ring's streams, in ms after the first span's start.
struct DeviceSpan {
  std::string what;
  float start_ms = 0, end_ms = 0;
};

struct RingStats {
  int steps = 0, skipped = 0;
  double compute_seconds = 0, wait_seconds = 0;  // wait: time blocked on the exchange after compute
  // With RingContext::time_steps on GPUs, device times per step: the local kernel (0 when skipped),
  // the exchange (none after the last step), and the whole ring from the first kernel to the last.
  std::vector<float> step_compute_ms, step_exchange_ms;
  float ring_ms = 0;
  // The GPU ring's backward with RingContext::time_steps: each compute, add, transfer and wait as a span.
  std::vector<DeviceSpan> spans;
  // GPU ring, host side: from entering the call to the first kernel queued (the device waits on this
  // when it is idle). The call returns without waiting for the last kernel.
  double host_before_first_kernel_ms = 0;
  std::string transport;  // how the blocks travelled: the communicator's back end, or "copy-engines"
};

class RingAttention final : public AttentionImpl {
 public:
  RingAttention(RingContext ctx, Backend backend);
  std::string_view name() const override { return "ring"; }
  Backend backend() const override { return backend_; }
  int64_t max_head_dim() const override { return local_->max_head_dim(); }
  bool takes_flash_kernel() const override { return local_->takes_flash_kernel(); }
  void accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                  Carry& carry) const override;
  // The host ring's backward (attention/ring/ring_backward.cc): K/V rotate as in the forward and the f32
  // dK/dV of each block travel one step behind it, each rank adding its part; a last hop brings every
  // block's dK/dV home. dQ stays local. (The GPU ring is RingAttentionCuda, attention/ring/ring_cuda.h.)
  bool has_backward() const override { return local_->has_backward(); }
  bool backward_reads_output() const override { return local_->backward_reads_output(); }
  void accumulate_backward(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                           const BackwardInputs& grad, const GradViews& acc) const override;
  // dsinks summed over the ring's ranks (dbias of a bias shared by every rank's rows is summed in
  // accumulate_backward; a bias of this rank's rows needs no sum).
  void reduce_sequence_gradients(Gradients& g) const override;
  void refuse_call(const std::exception_ptr& refused) const override;  // ring_call_start.h
  const RingStats& last_stats() const { return stats_; }

 private:
  RingContext ctx_;
  RingSchedule schedule_;
  Backend backend_;
  std::unique_ptr<AttentionImpl> local_;
  mutable RingStats stats_;
  mutable bool started_ = false;  // a call is past its start (RingCallStart)
  mutable Tensor exact_dsinks_;  // the deterministic backward's dsinks, for reduce_sequence_gradients

  // This rank's shard and positions are the layout's (checked before the call's start).
  void check_shard(const AttentionInputs& in, const TokenPositions& pos) const;
  // One trip around the ring: visit(block, positions, step, source rank) at every step, with block null
  // where the masks leave the block empty for this rank's queries; `fault` is the pass's fault plan.
  using BlockVisitor = std::function<void(const AttentionInputs*, const TokenPositions&, int, int)>;
  void rotate_blocks(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                     const FaultPlan& fault, const BlockVisitor& visit) const;
  // The backward's trip (attention/ring/ring_backward.cc): the blocks rotate as in rotate_blocks, and each
  // block's dK/dV sums travel one step behind it, each rank adding its part; a last hop brings them home.
  void carry_gradients(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                       const FaultPlan& fault, const GradientTrip& trip) const;
  // --deterministic's backward (attention/ring/ring_backward_exact.cc).
  void accumulate_backward_exact(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                                 const BackwardInputs& grad, const GradViews& acc) const;
};

}  // namespace ra
