// The GPU ring's backward. K/V blocks rotate exactly as in the forward (KvRotationCuda); beside them the f32 dK/dV
// accumulator of each other rank's block travels one step behind it, in two more buffers of the channel's window.
// A rank's own block adds to its own dK/dV, which never travel. On one stream: half of its keys at step 0, while
// its K/V leave, the other half at the end, while the last accumulator comes home, so that no transfer waits alone
// (with the own block first, the last hop of a whole accumulator did: 1.8 ms of a 29.6 ms call on 2 H200,
// bench/RESULTS.md). With two streams (two_streams below) the own block runs whole from step 0 and the other
// ranks' blocks beside it at a higher priority: they end first, and the last hop travels while the own block still
// computes; where the local kernel's calls hold their SMs (cudnn), half the own block runs beside them and half
// after them, over the last hop. At step s >= 1 a rank computes its part of the held block's dK/dV into a partial
// (zeroed first, unless the local kernel writes it over) while that block's accumulator (what the ranks before it
// added) is in flight to it, in the same shift as the next K/V block; once both are done it checks the
// accumulator's checksum, adds the partial in and reseals it, and the next shift passes it on. After the last
// step each accumulator is one hop from its owner. dK / dV's sums run in a fixed order: a given ring size and
// layout give the same bits on every run (dQ's too under --deterministic).
#include <algorithm>

#include "attention/backward.h"
#include "attention/cuda/backward_cuda.h"
#include "attention/ring/gradient_block.h"
#include "attention/ring/ring_call_start.h"
#include "attention/ring/ring_cuda.h"
#include "runtime/activity.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra {
namespace {

// `count` floats at `device` summed over the ring's ranks (in f64, the same order on every rank).
void sum_over_ring(Communicator& comm, float* device, size_t count, cudaStream_t stream) {
  std::vector<float> host(count);
  RA_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
  RA_CUDA_CHECK(cudaStreamSynchronize(stream));
  all_reduce_sum_f64(comm, host.data(), count);
  RA_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream));
  RA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// A second stream beside `main` for the span of a call: it starts after what `main` queued before, and
// `main` waits for all it queued at join() or, on every other way out (a throw), at the end of the scope.
class StreamsJoined {
 public:
  StreamsJoined(cudaStream_t side, cudaStream_t main) : side_(side), main_(main) {
    if (side_ == main_) return;
    started_.record(main_);
    RA_CUDA_CHECK(cudaStreamWaitEvent(side_, started_.get(), 0));
  }
  ~StreamsJoined() {
    if (side_ != main_ && !joined_ && cudaEventRecord(done_.get(), side_) == cudaSuccess)
      cudaStreamWaitEvent(main_, done_.get(), 0);
  }
  void join() {
    if (side_ == main_ || joined_) return;
    done_.record(side_);
    RA_CUDA_CHECK(cudaStreamWaitEvent(main_, done_.get(), 0));
    joined_ = true;
  }

 private:
  cudaStream_t side_, main_;
  CudaEvent started_, done_;
  bool joined_ = false;
};

// The local implementation's calls on `on` for the scope, then on `back` again.
class LocalStream {
 public:
  LocalStream(CudaAttentionImpl& local, cudaStream_t on, cudaStream_t back) : local_(local), back_(back) {
    if (on != back_) local_.set_cuda_stream(on);
    moved_ = on != back_;
  }
  ~LocalStream() {
    if (moved_) local_.set_cuda_stream(back_);
  }

 private:
  CudaAttentionImpl& local_;
  cudaStream_t back_;
  bool moved_;
};

}  // namespace

void RingAttentionCuda::accumulate_backward_device(const AttentionInputs& in, const DevicePositions& pos,
                                                   const AttentionParams& params, const BackwardInputs& grad,
                                                   const GradViews& acc) const {
  backward_steps(in, pos, params, grad, acc, nullptr);
}

bool RingAttentionCuda::backward_into(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                                      const BackwardInputs& grad, Gradients& out, const GradViews* into) const {
  if (ctx_.comm->size() == 1) return local_->backward_into(in, pos, params, grad, out, into);
  if (in.bias.defined()) return false;  // dbias, and a bias shared over the ring summed: the accumulator path
  check_backward_supported(in, params);
  // delta once a call: the caller's where it formed one (for the sinks' gradient), else here.
  const Tensor delta = grad.delta.defined() ? Tensor() : compute_delta(grad.o, grad.d_o, grad.d_lse, stream_);
  const GradAccumulators acc = GradAccumulators::temporary(in, MemoryKind::kCuda, stream_);
  const GradViews views = gradients_in_q_dtype(in, out, into);
  BackwardInputs with_delta = grad;
  if (delta.defined()) with_delta.delta = delta;
  backward_steps(in, ring_positions_on_device(pos), params, with_delta, acc.views(), &views);
  convert_gradient(acc.dq, views.dq, stream_);
  return true;
}

void RingAttentionCuda::backward_steps(const AttentionInputs& in, const DevicePositions& pos,
                                       const AttentionParams& params, const BackwardInputs& grad, const GradViews& acc,
                                       const GradViews* out) const {
  Communicator& comm = *ctx_.comm;
  const int n = comm.size(), rank = comm.rank();
  check_alike([&] {
    RA_CHECK(out == nullptr || n > 1, "the ring backward writes dk / dv in q's dtype only past one rank "
             "(a ring of one is its local kernel's backward_into)");
    check_shard_rows(in);
  });
  const RingCallStart start(comm, ctx_.step_timeout, started_, "ring backward");
  const int64_t slot_rows = schedule_.slot_rows();
  const GradientBlock layout{in.k.dim(0), in.k.dim(2), in.k.dim(3), in.v.dim(3), slot_rows, ctx_.gradient_wire};
  const GradientBlock part_layout = layout.in_f32();  // this step's part: always f32
  const bool f32_wire = layout.dtype == DType::kF32;
  const size_t payload = layout.payload(), bytes = sealed_bytes(payload);
  const size_t stride = (bytes + 4095) / 4096 * 4096;
  const FaultPlan fault = ctx_.fault.in_pass(FaultPlan::Pass::kBackward);
  KvRotationCuda kv(in, ctx_, fault, schedule_.rows_of_each_rank(), slot_rows, n > 1 ? 2 * stride : 0, state_, stream_);
  const bool verify = ctx_.verify_blocks && n > 1;
  stats_ = RingStats{};
  step_times_pending_ = false;
  spans_.clear();
  // RingContext::time_steps: every compute, add, transfer and wait as a span of device time (stats_.spans).
  const bool timed = ctx_.time_steps;
  // Its name is put together only when timed: untimed calls build no strings.
  auto span = [&](cudaStream_t stream, const auto&... name) {
    return timed ? spans_.begin(detail::concat(name...), stream) : -1;
  };
  auto end_span = [&](int id, cudaStream_t stream) {
    if (id >= 0) spans_.end(id, stream);
  };
  stats_.transport = state_.channel ? ring_transport_name(state_.channel->transport()) : comm.backend_name();
  // A shared bias's gradient: this rank's part in a zeroed tensor, summed over the ring at the end (on every
  // rank alike, whether or not this one asked for the gradient: the sum is collective).
  const bool shared_bias = n > 1 && bias_shared_over_ring(comm, in);
  Tensor dbias_part;
  if (shared_bias) dbias_part = Tensor::temporary(DType::kF32, in.bias.shape(), MemoryKind::kCuda, stream_);
  const TensorView dbias = shared_bias ? dbias_part.view() : acc.dbias;
  // The accumulators' buffers: [sending] passed on at the next shift, [arriving] coming in at this one.
  char* slot[2] = {kv.extra(), kv.extra() + stride};
  const size_t slot_offset[2] = {kv.window_offset_of_extra(), kv.window_offset_of_extra() + stride};
  int sending = 0, arriving = 1;
  if (n > 1) reserve_scratch(partial_, part_layout.payload(), MemoryKind::kCuda, "the ring backward's partial dK/dV");
  // The accumulator in flight += the partial: in f32 on an f32 wire; on a bf16 wire the partial takes
  // the arrived values and the sum goes back rounded to bf16.
  auto add_into_wire = [&](char* wire, int64_t rows, cudaStream_t on) {
    char* part = partial_.data<char>();
    const std::pair<TensorView, TensorView> sections[2] = {
        {layout.dk_view(wire, rows, MemoryKind::kCuda), part_layout.dk_view(part, rows, MemoryKind::kCuda)},
        {layout.dv_view(wire, rows, MemoryKind::kCuda), part_layout.dv_view(part, rows, MemoryKind::kCuda)}};
    for (const auto& [wire_view, part_view] : sections) {
      if (f32_wire) {
        add_rows_cuda(wire_view, part_view, on);
      } else {
        add_rows_cuda(part_view, wire_view, on);
        convert_f32_cuda(part_view, wire_view, on);
      }
    }
  };
  // Per hop 1..n: the seal the accumulator arrived with, and its checksum recomputed here.
  reserve_scratch(gradient_checks_, 2 * size_t(n + 1) * sizeof(BlockSeal), MemoryKind::kCuda,
                  "the ring backward's accumulator checks");
  auto* arrived_seals = gradient_checks_.data<BlockSeal>();
  auto* recomputed = arrived_seals + (n + 1);
  // The accumulators' seals and checksums run on the channel's stream, beside the compute: each is
  // sealed right before the shift that sends it, and checked right after the shift that brings it.
  cudaStream_t channel_stream = n > 1 ? state_.channel->stream() : stream_;
  if (verify)
    RA_CUDA_CHECK(cudaMemsetAsync(arrived_seals, 0, 2 * size_t(n + 1) * sizeof(BlockSeal), channel_stream));
  CudaEvent compute_done, gradient_arrived;
  const char* transport = kv.transport();
  // The accumulator in [sending], finished (the channel waited for compute_done), sealed as the block of `origin`'s.
  auto seal_sending = [&](int origin) {
    if (verify) seal_block_cuda(slot[sending], payload, uint32_t(origin), channel_stream);
  };
  // Once the shift that brings hop `hop`'s accumulator into [arriving] is queued: its seal and checksum,
  // taken before anything changes it, then gradient_arrived.
  auto check_arrival = [&](int hop) {
    if (verify) {
      RA_CUDA_CHECK(cudaMemcpyAsync(&arrived_seals[hop], slot[arriving] + payload, sizeof(BlockSeal),
                                    cudaMemcpyDeviceToDevice, channel_stream));
      block_checksum_cuda(slot[arriving], payload, &recomputed[hop].checksum, channel_stream);
    }
    gradient_arrived.record(channel_stream);
  };
  auto take_arrival = [&](int hop, cudaStream_t on) {
    const int id = span(on, "hop ", hop, ": wait for the accumulator");
    RA_CUDA_CHECK(cudaStreamWaitEvent(on, gradient_arrived.get(), 0));
    end_span(id, on);
  };
  // Whether the mask leaves keys [first, first + count) of the block from `src` to none of this rank's queries.
  auto skipped = [&](int src, int64_t first, int64_t count) {
    return schedule_.skipped(src, params, first, count);
  };
  // With the local backward's sums in a fixed order, a deterministic ring gives the same bits on every run.
  AttentionParams local_params = params;
  local_params.deterministic = params.deterministic || ctx_.deterministic;
  // The other ranks' blocks run on a second stream (`steps`), the own block on the compute stream: each
  // launch ends in a part-filled wave (its key blocks walk alike), which then overlaps the other stream's
  // blocks instead of idling SMs. `steps` is above the compute stream's priority (below the transfers'),
  // so its blocks take the SMs first and the last accumulator leaves while the own block's fill the rest;
  // the own block is one launch, whose long and short causal walks fill each other's tails (a diagonal
  // half alone at the end ran a third below the kernel's rate). Where the local kernel's calls can run at
  // once (flash_attn2 and cudnn, not deterministic: dQ's atomics then add in no fixed order anyway) and the own
  // block goes straight into dk / dv (B = 1; else it shares the partial with the steps); else one stream.
  const bool two_streams = n > 1 && local_->independent_backward_calls(local_params) && acc.dk.dim(0) == 1;
  if (two_streams && !state_.steps_stream)
    state_.steps_stream = std::make_unique<CudaStream>(StreamPriority::kAboveNormal);
  const cudaStream_t steps = two_streams ? state_.steps_stream->get() : stream_;
  StreamsJoined joined(steps, stream_);
  // Where the local kernel writes every row of dk / dv on request (GradViews::kv_unset), the partials it
  // starts are not zeroed first, nor read back.
  const bool writes_kv = local_->writes_unset_kv();
  // This rank's part of those keys' dK/dV (and its dQ) added into `dk`/`dv` (written over where `unset`, which
  // only a local kernel that writes_kv is asked), queued on `on`.
  auto compute = [&](const AttentionInputs& block, int src, int64_t first, int64_t count, const TensorView& dk,
                     const TensorView& dv, cudaStream_t on, bool unset) {
    const LocalStream local_on(*local_, on, stream_);
    AttentionInputs part = block;
    part.k = narrow(block.k, 1, first, count);
    part.v = narrow(block.v, 1, first, count);
    if (block.kv_segment_ids.defined()) part.kv_segment_ids = narrow(block.kv_segment_ids, 1, first, count);
    const DevicePositions part_pos = block_positions(pos, src).keys_from(first);
    GradViews views{acc.dq, dk, dv, dbias};
    views.kv_unset = unset && writes_kv;
    local_->accumulate_backward_device(part, part_pos, local_params, grad, views);
  };
  if (n == 1) {
    if (skipped(rank, 0, in.k.dim(1))) ++stats_.skipped;
    else compute(in, rank, 0, in.k.dim(1), acc.dk, acc.dv, stream_, acc.kv_unset);
    ++stats_.steps;
  }
  // This rank's own block adds to its own dK / dV, which never travel: on one stream half of its keys
  // while its K/V leave for the first exchange, the other half while the last accumulator comes home, so
  // that neither transfer waits alone; with two streams all of it from step 0 (above) where the local
  // kernel's calls give way to the steps' higher priority, else half then and half once the last step
  // is done (a kernel that holds its SMs shares them with the steps, which would end with the own block
  // and leave the last hop alone). Straight into the caller's accumulators where the rows are contiguous
  // there (B = 1), else through the zeroed partial.
  const bool own_whole = two_streams && local_->backward_yields_to_priority();
  const int64_t own_rows = in.k.dim(1), own_first = own_whole ? own_rows : own_rows / 2;
  // (Its rows of the caller's accumulators are written over only where they hold nothing to keep: backward_into's
  // own, `out`, or the caller's under kv_unset; else added into.)
  const bool own_unset = out != nullptr || acc.kv_unset;
  auto own_keys = [&](int64_t first, int64_t count) {
    const TensorView dk = narrow(acc.dk, 1, first, count), dv = narrow(acc.dv, 1, first, count);
    if (dk.is_contiguous() && dv.is_contiguous()) return compute(in, rank, first, count, dk, dv, stream_, own_unset);
    char* part = partial_.data<char>();
    if (!writes_kv) RA_CUDA_CHECK(cudaMemsetAsync(part, 0, part_layout.payload(), stream_));
    const TensorView pk = part_layout.dk_view(part, count, MemoryKind::kCuda);
    const TensorView pv = part_layout.dv_view(part, count, MemoryKind::kCuda);
    compute(in, rank, first, count, pk, pv, stream_, true);
    add_rows_cuda(dk, pk, stream_);
    add_rows_cuda(dv, pv, stream_);
  };
  auto own_part = [&](int64_t first, int64_t count) {
    if (skipped(rank, first, count)) {
      ++stats_.skipped;
      return;
    }
    const int id = span(stream_, "own keys [", first, ", ", first + count, ")");
    own_keys(first, count);
    end_span(id, stream_);
  };
  // Step 1 computes straight into the first accumulator on an f32 wire; a local kernel that writes it over
  // leaves nothing to zero there.
  const bool step1_writes_slot =
      n > 1 && writes_kv && f32_wire && !skipped(schedule_.source(1), 0, schedule_.rows(schedule_.source(1)));
  // Step s >= 1 computes the block of rank src(s) and adds to its accumulator, which the ranks after
  // that block's owner start (step 1: into [sending], zeroed, as nobody has added before) and pass
  // on one step behind the K/V block: what arrives at step s >= 2 is finished there and sent at s + 1.
  for (int step = 0; n > 1 && step < n; ++step) {
    inject_process_fault(fault, rank, step);
    const int src = schedule_.source(step);
    set_activity("ring backward step %d of %d (%s): the K/V block of rank %d and its dK/dV", step, n, transport, src);
    if (step > 0) kv.before_exchange(step, compute_done.get());  // also orders the accumulator sent now
    kv.before_compute(step, step == 0 ? stream_ : steps);
    const int64_t rows = schedule_.rows(src);
    const bool computed = step > 0 && !skipped(src, 0, rows);
    if (step == 0) {
      own_part(0, own_first);
    } else {
      if (!computed) {
        ++stats_.skipped;
      } else {
        char* target = step == 1 && f32_wire ? slot[sending] : partial_.data<char>();
        const int id = span(steps, "step ", step, ": rank ", src, "'s block");
        if (target != slot[sending] && !writes_kv)
          RA_CUDA_CHECK(cudaMemsetAsync(target, 0, part_layout.payload(), steps));
        compute(kv.block(step, src), src, 0, rows, part_layout.dk_view(target, rows, MemoryKind::kCuda),
                part_layout.dv_view(target, rows, MemoryKind::kCuda), steps, true);
        end_span(id, steps);
      }
    }
    // One shift: the held K/V block (but at the last step) and the accumulator finished at the previous step.
    std::vector<DeviceRingChannel::Piece> pieces;
    if (step + 1 < n) pieces = kv.outgoing(step);
    // The first accumulator starts at zero, zeroed beside step 0's compute (step 1's compute waits for
    // the K/V block that arrives after it on this stream), unless step 1's compute writes all of it.
    if (step == 0 && !step1_writes_slot) RA_CUDA_CHECK(cudaMemsetAsync(slot[sending], 0, payload, channel_stream));
    if (step >= 2) {
      seal_sending(schedule_.source(step - 1));
      pieces.push_back({slot[sending], slot_offset[arriving], bytes});
    }
    if (step == 1 && !f32_wire && computed) {
      const int id = span(steps, "step 1: add");
      add_into_wire(slot[sending], rows, steps);
      end_span(id, steps);
    }
    // Step 1: the first accumulator is complete (it leaves at step 2).
    if (step <= 1) compute_done.record(step == 0 ? stream_ : steps);
    // Nothing moves at step 1 of a ring of two (its first accumulator goes home on the last hop).
    std::unique_ptr<PendingExchange> pending;
    if (!pieces.empty()) {
      const int id = span(channel_stream, "step ", step, ": shift");
      pending = state_.channel->shift(pieces, step, ctx_.step_timeout);
      end_span(id, channel_stream);
    }
    if (step + 1 < n) kv.after_shift(step);
    if (step >= 2) {
      // What arrives (hop step - 1) goes on at the next shift, with this rank's part added, sealed anew.
      check_arrival(step - 1);
      take_arrival(step - 1, steps);
      if (computed) {
        const int id = span(steps, "step ", step, ": add");
        add_into_wire(slot[arriving], rows, steps);
        end_span(id, steps);
      }
      compute_done.record(steps);
    }
    set_activity("ring backward step %d of %d (%s): waiting for rank %d's K/V block and dK/dV (ours going to rank %d)",
                 step, n, transport, comm.previous(), comm.next());
    const auto t1 = std::chrono::steady_clock::now();
    if (pending) pending->wait(ctx_.step_timeout);
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    if (step + 1 < n) kv.advance();
    if (step >= 2) std::swap(sending, arriving);
    ++stats_.steps;
    if (ctx_.on_step) ctx_.on_step(step, n);
  }
  if (n > 1) {
    // The last hop (n - 1): the accumulator held now is the next rank's block's, complete but for its
    // owner's part; ours comes from the previous rank while the other half of our own block computes.
    set_activity("ring backward (%s): the last hop, rank %d's dK/dV coming home from rank %d", transport, rank,
                 comm.previous());
    state_.channel->wait_for(compute_done.get());
    const int hop_span = span(channel_stream, "last hop: seal, send");
    seal_sending(schedule_.source(n - 1));
    std::unique_ptr<PendingExchange> pending =
        state_.channel->shift({{slot[sending], slot_offset[arriving], bytes}}, n, ctx_.step_timeout);
    end_span(hop_span, channel_stream);
    if (const std::optional<size_t> at = corrupted_byte(fault, rank, n, payload))
      flip_byte_cuda(slot[arriving], *at, channel_stream);  // the fault tests' hook for accumulators
    check_arrival(n - 1);
    if (own_first < own_rows) {
      if (two_streams) RA_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_done.get(), 0));
      own_part(own_first, own_rows - own_first);
    }
    pending->wait(ctx_.step_timeout);
    take_arrival(n - 1, stream_);
    if (!out) {  // else added as the gradients are written, once every arrival has been checked (below)
      const int id = span(stream_, "last hop: add into own dK/dV");
      add_rows_cuda(acc.dk, layout.dk_view(slot[arriving], own_rows, MemoryKind::kCuda), stream_);
      add_rows_cuda(acc.dv, layout.dv_view(slot[arriving], own_rows, MemoryKind::kCuda), stream_);
      end_span(id, stream_);
    }
  }
  joined.join();  // dQ, the window's reads and dbias' adds of the other ranks' blocks are done
  // Every block and accumulator that arrived is checked before the gradients are used.
  try {
    kv.check_arrivals();
    if (verify) {
      const std::vector<BlockSeal> host = read_seals(arrived_seals, 2 * size_t(n + 1), stream_);
      for (int hop = 1; hop < n; ++hop) {
        const BlockSeal& got = host[size_t(hop)];
        const uint64_t checksum = host[size_t(n + 1 + hop)].checksum;
        const int origin = schedule_.source(hop + 1);  // the block the accumulator of this hop belongs to
        RA_CHECK(got.magic == BlockSeal::kMagic && int(got.origin_rank) == origin && got.checksum == checksum,
                 "ring backward hop ", hop, " of ", n - 1, " (", transport, "): rank ", rank, " received the dK/dV accumulator "
                 "of rank ", origin, "'s block from rank ", comm.previous(), " (", dtype_name(layout.dtype), ", ", payload,
                 " bytes) with checksum ",
                 std::hex, checksum, " but it was sent with ", got.checksum, std::dec, " (origin rank in the seal: ",
                 got.origin_rank, "): the accumulator was corrupted in flight; no gradient is produced");
      }
    }
  } catch (...) {
    kv.finish(stream_);
    cudaStreamSynchronize(stream_);
    throw;
  }
  if (shared_bias) {
    sum_over_ring(comm, dbias_part.data<float>(), size_t(dbias_part.numel()), stream_);
    if (acc.dbias.defined()) add_rows_cuda(acc.dbias, dbias_part.view(), stream_);
  }
  if (out) {  // dK / dV in the output's dtype: the own block's parts plus the accumulator that came home
    const int id = span(stream_, "last hop: add into own dK/dV, converted");
    add_convert_cuda(acc.dk, layout.dk_view(slot[arriving], own_rows, MemoryKind::kCuda), out->dk, stream_);
    add_convert_cuda(acc.dv, layout.dv_view(slot[arriving], own_rows, MemoryKind::kCuda), out->dv, stream_);
    end_span(id, stream_);
  }
  kv.finish(stream_);  // after the last read of the window's accumulator
}

void RingAttentionCuda::reduce_sequence_gradients(Gradients& g) const {
  if (g.dsinks.defined() && ctx_.comm->size() > 1)
    sum_over_ring(*ctx_.comm, g.dsinks.data<float>(), size_t(g.dsinks.numel()), stream_);
}

}  // namespace ra
