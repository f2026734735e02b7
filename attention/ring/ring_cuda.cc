// The GPU ring. Per step: the compute stream folds the held block into the carry; the communicator's
// stream waits until the buffer it receives into is no longer read (by the previous step's compute
// and by the checksum of the block it held), then shifts the held block; the host waits for the
// shift with a deadline (NCCL errors are polled meanwhile) before it queues the next step, which
// reads the block that arrived. Each step's kernel may start on the SMs the previous step's last
// blocks leave idle (it waits for the previous kernel only before it reads the carry).
#include "attention/ring/ring_cuda.h"

#include <algorithm>

#include "attention/ring/kv_rotation_cuda.h"
#include "attention/ring/ring_call_start.h"
#include "attention/registry.h"
#include "runtime/activity.h"
#include "runtime/cuda_device.h"

namespace ra {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

RingAttentionCuda::RingAttentionCuda(RingContext ctx) : ctx_(std::move(ctx)), schedule_(ring_schedule(ctx_)) {
  RA_CHECK(ctx_.local_impl != "ring", "the ring's local kernel cannot be 'ring'");
  std::unique_ptr<AttentionImpl> local = AttentionRegistry::builtin().create(ctx_.local_impl, Backend::kCuda);
  local_.reset(dynamic_cast<CudaAttentionImpl*>(local.release()));
  RA_CHECK(local_ != nullptr, "local kernel '", ctx_.local_impl, "' has no device implementation");
  if (schedule_.ranks() > 1) state_.channel = make_device_ring_channel(ctx_);
}

RingAttentionCuda::~RingAttentionCuda() = default;

void RingAttentionCuda::set_cuda_stream(void* stream) {
  CudaAttentionImpl::set_cuda_stream(stream);
  local_->set_cuda_stream(stream);
}

const DevicePositions& RingAttentionCuda::ring_positions_on_device(const TokenPositions& pos) const {
  if (uploaded_.q == nullptr || pos.q != uploaded_q_ || pos.total_keys != uploaded_.total_keys) {
    // One upload: this rank's query positions, then every rank's key positions.
    TokenPositions all = pos;
    all.k = schedule_.all_keys();
    uploaded_ = positions_.upload(all, stream_);
    uploaded_.keys_sorted = schedule_.keys_sorted();
    uploaded_.q_host = uploaded_.k_host = nullptr;  // `all` goes; the walks point them at the layout's copies
    uploaded_q_ = pos.q;
  }
  return uploaded_;
}

DevicePositions RingAttentionCuda::block_positions(const DevicePositions& pos, int source) const {
  DevicePositions block = pos.keys_from(schedule_.key_offset(source));
  block.q_host = schedule_.query_positions().data(), block.k_host = schedule_.keys(source).data();
  block.key_pairing = schedule_.keys_pair_up(source) ? DevicePositions::KeyPairing::kPairs
                                                     : DevicePositions::KeyPairing::kApart;
  return block;
}

void RingAttentionCuda::accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                                   Carry& carry) const {
  const auto entered = std::chrono::steady_clock::now();
  check_supported(in, params);
  run(in, ring_positions_on_device(pos), params, carry, entered);
}

void RingAttentionCuda::check_shard_rows(const AttentionInputs& in) const {
  const int rank = ctx_.comm->rank();
  const int64_t local_kv = schedule_.rows(rank);
  RA_CHECK(in.k.dim(1) == local_kv, "k dimension 1 (kv_len) is ", in.k.dim(1), " on rank ", rank,
           ", expected the local shard of ", local_kv, " rows");
  RA_CHECK(int64_t(schedule_.query_positions().size()) == in.q.dim(1), "q dimension 1 (q_len) is ", in.q.dim(1),
           " on rank ", rank, ", expected the local shard of ", schedule_.query_positions().size(), " rows");
  for (auto [t, name] : {std::pair{&in.k, "k"}, std::pair{&in.v, "v"}, std::pair{&in.kv_segment_ids, "kv_segment_ids"}})
    RA_CHECK(!t->defined() || t->is_contiguous(), name, " must be contiguous for ring on cuda (it travels as one block)");
}

void RingAttentionCuda::refuse_call(const std::exception_ptr& refused) const {
  join_refused_call(*ctx_.comm, ctx_.step_timeout, started_, refused);
}

void RingAttentionCuda::accumulate_device(const AttentionInputs& in, const DevicePositions& pos,
                                          const AttentionParams& params, Carry& carry) const {
  run(in, pos, params, carry, std::chrono::steady_clock::now());
}

void RingAttentionCuda::run(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                            Carry& carry, std::chrono::steady_clock::time_point entered) const {
  Communicator& comm = *ctx_.comm;
  const int n = comm.size(), rank = comm.rank();
  check_alike([&] { check_shard_rows(in); });
  const RingCallStart start(comm, ctx_.step_timeout, started_, "ring forward");
  const FaultPlan fault = ctx_.fault.in_pass(FaultPlan::Pass::kForward);
  KvRotationCuda kv(in, ctx_, fault, schedule_.rows_of_each_rank(), schedule_.slot_rows(), 0, state_, stream_);
  CudaEvent compute_done;  // the last compute queued on the compute stream
  const char* transport = kv.transport();
  stats_ = RingStats{};
  step_times_pending_ = false;  // the events are recorded again
  spans_.clear();               // a backward's, not this call's
  stats_.transport = state_.channel ? ring_transport_name(state_.channel->transport()) : comm.backend_name();
  const bool timed = ctx_.time_steps;
  if (timed)
    while (step_events_.size() < 4 * size_t(n)) step_events_.push_back(std::make_unique<CudaEvent>(true));
  int kernels_queued = 0;
  for (int step = 0; step < n; ++step) {
    inject_process_fault(fault, rank, step);
    const int src = schedule_.source(step);
    set_activity("ring step %d of %d (%s): exchanging with ranks %d / %d, then the K/V block of rank %d", step, n,
                 transport, comm.previous(), comm.next(), src);
    // The compute is queued before the exchange (queuing NCCL work takes the host a while and the
    // compute stream would idle meanwhile), but the exchange waits only for the previous compute,
    // which last read the buffer it receives into (at steps 0 and 1 none did: before_exchange).
    const bool exchange = step + 1 < n;
    if (exchange) kv.before_exchange(step, compute_done.get());
    kv.before_compute(step);
    const auto t0 = std::chrono::steady_clock::now();
    if (timed) step_event(step, 0)->record(stream_);
    if (schedule_.skipped(src, params)) {  // every block where this rank holds no query
      ++stats_.skipped;
    } else {
      const AttentionInputs block = kv.block(step, src);
      const DevicePositions block_pos = block_positions(pos, src);
      // After the first kernel of this call, the compute stream holds only this call's kernels (and
      // events): the previous one writes nothing this one reads but the carry.
      local_->set_after_carry_writer(kernels_queued > 0);
      local_->accumulate_device(block, block_pos, params, carry);
      ++kernels_queued;
    }
    if (step == 0) stats_.host_before_first_kernel_ms = 1e3 * seconds_since(entered);
    if (timed) step_event(step, 1)->record(stream_);
    compute_done.record(stream_);
    stats_.compute_seconds += seconds_since(t0);  // host time to queue; device time is in the bench
    // Every block has arrived and been checked on the check stream; compare while the last
    // kernel runs, so that nothing waits for the device at the end and the caller's next work (the
    // finalize) queues right behind it. On a mismatch the last kernel is let finish before the error
    // leaves (it writes the caller's carry), and the carry is discarded with it.
    if (step + 1 == n) {
      try {
        kv.check_arrivals();
      } catch (...) {
        cudaStreamSynchronize(stream_);
        throw;
      }
    }
    if (exchange) {
      DeviceRingChannel& channel = *state_.channel;
      const std::vector<DeviceRingChannel::Piece> pieces = kv.outgoing(step);
      if (timed) step_event(step, 2)->record(channel.stream());
      std::unique_ptr<PendingExchange> pending = channel.shift(pieces, step, ctx_.step_timeout);
      if (timed) step_event(step, 3)->record(channel.stream());
      kv.after_shift(step);
      const auto t1 = std::chrono::steady_clock::now();
      set_activity("ring step %d of %d (%s): waiting for the K/V block from rank %d (ours going to rank %d)", step, n,
                   transport, comm.previous(), comm.next());
      pending->wait(ctx_.step_timeout);
      stats_.wait_seconds += seconds_since(t1);
      kv.advance();
    }
    ++stats_.steps;
    if (ctx_.on_step) ctx_.on_step(step, n);
  }
  kv.finish(stream_);
  step_times_pending_ = timed;  // read from the events by last_stats(), once the caller has waited
}

CudaEvent* RingAttentionCuda::step_event(int step, int which) const {
  return step_events_[4 * size_t(step) + size_t(which)].get();
}

const RingStats& RingAttentionCuda::last_stats() const {
  if (!spans_.empty()) {
    stats_.spans = spans_.read();
    spans_.clear();
  }
  if (step_times_pending_) {
    step_times_pending_ = false;
    const int n = stats_.steps;
    RA_CUDA_CHECK(cudaEventSynchronize(step_event(n - 1, 1)->get()));  // the last on each stream
    if (n > 1) RA_CUDA_CHECK(cudaEventSynchronize(step_event(n - 2, 3)->get()));
    for (int step = 0; step < n; ++step) {
      stats_.step_compute_ms.push_back(step_event(step, 1)->milliseconds_since(*step_event(step, 0)));
      if (step + 1 < n)
        stats_.step_exchange_ms.push_back(step_event(step, 3)->milliseconds_since(*step_event(step, 2)));
    }
    stats_.ring_ms = step_event(n - 1, 1)->milliseconds_since(*step_event(0, 0));
  }
  return stats_;
}

}  // namespace ra
