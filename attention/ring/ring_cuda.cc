// The GPU ring. Per step: the compute stream folds the held block into the carry; the communicator's
// stream waits until the buffer it receives into is no longer read (by the previous step's compute
// and by the checksum of the block it held), then shifts the held block; the host waits for the
// shift with a deadline (NCCL errors are polled meanwhile) before it queues the next step, which
// reads the block that arrived. Each step's kernel may start on the SMs the previous step's last
// blocks leave idle (it waits for the previous kernel only before it reads the carry).
#include "attention/ring/ring_cuda.h"

#include <algorithm>

#include "attention/ring/block_schedule.h"
#include "attention/ring/block_checksum.h"
#include "attention/registry.h"
#include "collectives/nccl_communicator.h"
#include "collectives/peer_copy_ring.h"
#include "runtime/activity.h"
#include "runtime/cuda_device.h"
#include "runtime/memory.h"

namespace ra {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The trailers that arrived and the checksums recomputed on arrival (device, n each; step 0 unused),
// read once `stream` (the one that checks arrivals) is done:
// the first mismatch is an error naming the step, the ranks and both checksums. The corrupted block
// was folded into the carry, which is discarded with the error: nothing is finalized or written.
void check_arrived_blocks(const Tensor& checks, int n, int rank, size_t payload, const AttentionInputs& in,
                          const char* transport, cudaStream_t stream) {
  std::vector<BlockTrailer> host(2 * size_t(n));
  RA_CUDA_CHECK(cudaMemcpyAsync(host.data(), checks.view().data(), host.size() * sizeof(BlockTrailer),
                                cudaMemcpyDeviceToHost, stream));
  RA_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int step = 1; step < n; ++step) {
    const BlockTrailer& got = host[size_t(step)];
    const uint64_t recomputed = host[size_t(n + step)].checksum;
    const int expected_origin = ring_source_rank(rank, step, n);
    RA_CHECK(got.magic == BlockTrailer::kMagic && int(got.origin_rank) == expected_origin && got.checksum == recomputed,
             "ring step ", step - 1, " (", transport, "): rank ", rank, " received the K/V block of rank ", expected_origin,
             " from rank ", (rank + n - 1) % n, " (k ", in.k.shape().str(), " and v ", in.v.shape().str(), ", ", payload,
             " bytes) with checksum ", std::hex, recomputed, " but it was sent with ", got.checksum, std::dec,
             " (origin rank in the trailer: ", got.origin_rank, "): the block was corrupted in flight; no output is "
             "produced");
  }
}

}  // namespace

RingAttentionCuda::RingAttentionCuda(RingContext ctx) : ctx_(std::move(ctx)) {
  RA_CHECK(ctx_.comm != nullptr, "the ring implementation needs a communicator (RingContext::comm)");
  RA_CHECK(ctx_.local_impl != "ring", "the ring's local kernel cannot be 'ring'");
  RA_CHECK(!ctx_.deterministic, "the deterministic ring (bitwise-identical results for any ring size) runs on the "
           "host: use --backend cpu");
  RA_CHECK(ctx_.comm->size() == 1 || dynamic_cast<NcclCommunicator*>(ctx_.comm) != nullptr,
           "ring on cuda needs an NCCL communicator for its sequence axis (got '", ctx_.comm->backend_name(), "')");
  std::unique_ptr<AttentionImpl> local = AttentionRegistry::builtin().create(ctx_.local_impl, Backend::kCuda);
  local_.reset(dynamic_cast<CudaAttentionImpl*>(local.release()));
  RA_CHECK(local_ != nullptr, "local kernel '", ctx_.local_impl, "' has no device implementation");
  const int n = ctx_.comm->size(), rank = ctx_.comm->rank();
  query_positions_ = layout_query_positions(ctx_.layout, ctx_.global_q_len, ctx_.global_kv_len, n, rank);
  if (!query_positions_.empty()) {
    q_lo_ = *std::min_element(query_positions_.begin(), query_positions_.end());
    q_hi_ = *std::max_element(query_positions_.begin(), query_positions_.end());
  }
  for (int r = 0; r < n; ++r) {
    key_offsets_.push_back(key_offsets_.empty() ? 0 : key_offsets_.back() + int64_t(source_keys_.back().size()));
    source_keys_.push_back(layout_indices(ctx_.layout, ctx_.global_kv_len, n, r));
    source_keys_sorted_ = source_keys_sorted_ && std::is_sorted(source_keys_.back().begin(), source_keys_.back().end());
  }
  if (n > 1 && ctx_.transport != RingTransport::kNccl) {
    RA_CHECK(ctx_.host_comm != nullptr || ctx_.transport == RingTransport::kAuto,
             "ring transport copy-engines needs the sequence axis over MPI too (RingContext::host_comm)");
    RA_CHECK(ctx_.host_comm == nullptr || (ctx_.host_comm->size() == n && ctx_.host_comm->rank() == rank),
             "RingContext::host_comm is rank ", ctx_.host_comm ? ctx_.host_comm->rank() : 0, " of ",
             ctx_.host_comm ? ctx_.host_comm->size() : 0, " but the ring's communicator is rank ", rank, " of ", n);
    std::string why;
    copy_engines_ = ctx_.host_comm != nullptr && PeerCopyRing::supported(*ctx_.host_comm, &why);
    RA_CHECK(copy_engines_ || ctx_.transport == RingTransport::kAuto, "ring transport copy-engines cannot run here (it "
             "needs each rank's next rank on the same node, with peer access and interprocess events): ", why,
             " (use --ring-transport nccl or auto)");
  }
}

RingAttentionCuda::~RingAttentionCuda() = default;

void RingAttentionCuda::set_cuda_stream(void* stream) {
  CudaAttentionImpl::set_cuda_stream(stream);
  local_->set_cuda_stream(stream);
}

void RingAttentionCuda::accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                                   Carry& carry) const {
  const auto entered = std::chrono::steady_clock::now();
  check_supported(in, params);
  if (uploaded_.q == nullptr || pos.q != uploaded_q_ || pos.total_keys != uploaded_.total_keys) {
    // One upload: this rank's query positions, then every rank's key positions.
    TokenPositions all = pos;
    all.k.clear();
    for (const std::vector<int64_t>& keys : source_keys_) all.k.insert(all.k.end(), keys.begin(), keys.end());
    uploaded_ = positions_.upload(all, stream_);
    uploaded_.keys_sorted = source_keys_sorted_;
    uploaded_.q_host = uploaded_.k_host = nullptr;  // `all` goes; run() points them at the layout's copies
    uploaded_q_ = pos.q;
  }
  run(in, uploaded_, params, carry, entered);
}

void RingAttentionCuda::accumulate_device(const AttentionInputs& in, const DevicePositions& pos,
                                          const AttentionParams& params, Carry& carry) const {
  run(in, pos, params, carry, std::chrono::steady_clock::now());
}

void RingAttentionCuda::run(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                            Carry& carry, std::chrono::steady_clock::time_point entered) const {
  Communicator& comm = *ctx_.comm;
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl) nccl->set_timeout(ctx_.step_timeout);
  const int n = comm.size(), rank = comm.rank();
  const int64_t local_kv = int64_t(source_keys_[size_t(rank)].size());
  RA_CHECK(in.k.dim(1) == local_kv, "k dimension 1 (kv_len) is ", in.k.dim(1), " on rank ", rank,
           ", expected the local shard of ", local_kv, " rows");
  for (auto [t, name] : {std::pair{&in.k, "k"}, std::pair{&in.v, "v"}, std::pair{&in.kv_segment_ids, "kv_segment_ids"}})
    RA_CHECK(!t->defined() || t->is_contiguous(), name, " must be contiguous for ring on cuda (it travels as one block)");

  // Block layout: k, v, then the kv segment ids, each 256-byte aligned (the kernels' row loads stay
  // on whole cache sectors), then the trailer: the block's checksum and origin rank, computed once by
  // the rank it starts on and forwarded with it. The two buffers start 4096 bytes apart or more.
  // Sections are sized for the longest shard; a shorter block (a length that does not divide) sits at
  // the start of each, zeros behind it.
  const KvBlockLayout layout(in, layout_max_rows(ctx_.layout, ctx_.global_kv_len, n), 256);
  const size_t payload = layout.payload, bytes = payload + sizeof(BlockTrailer);
  const size_t stride = (bytes + 4095) / 4096 * 4096;
  const bool verify = ctx_.verify_blocks && n > 1;
  RA_CHECK(int64_t(query_positions_.size()) == in.q.dim(1), "q dimension 1 (q_len) is ", in.q.dim(1), " on rank ",
           rank, ", expected the local shard of ", query_positions_.size(), " rows");
  CudaEvent inputs_ready;     // q, k and v written (by whatever the caller queued before this call)
  CudaEvent arrived_block;    // on the communicator's stream, after a block arrived (the next kernel reads it)
  CudaEvent checked[2];       // after the checksum of the block that arrived in buffer i (its next writer waits)
  CudaEvent compute_done;     // the last compute queued on the compute stream
  inputs_ready.record(stream_);
  // Checks: per step, the checksum the block arrived with (its trailer) and the one recomputed here,
  // compared on the host while the last kernel runs, before anything is finalized; then the trailer
  // of this rank's own block when it travels without being packed (below).
  reserve_scratch(checks_, (2 * n + 1) * sizeof(BlockTrailer), MemoryKind::kCuda, "the ring's block checks");
  if (verify && !check_stream_) check_stream_ = std::make_unique<CudaStream>();
  auto* arrived = checks_.data<BlockTrailer>();
  auto* recomputed = arrived + n;
  BlockTrailer* own_trailer = arrived + 2 * n;
  char* base[2] = {nullptr, nullptr};
  if (n > 1) {
    // The next rank maps these buffers: they are replaced (on every rank, the shapes agree) only after
    // the mapping is gone.
    if (peers_ && peers_->window_bytes() < 2 * stride) peers_.reset();
    reserve_scratch(blocks_, 2 * stride, MemoryKind::kCuda, "the ring's two K/V block buffers");
    base[0] = blocks_.data<char>(), base[1] = base[0] + stride;
    if (copy_engines_ && !peers_)
      peers_ = std::make_unique<PeerCopyRing>(*ctx_.host_comm, blocks_.data<char>(), blocks_.view().nbytes(), nccl->stream());
  }
  const char* transport = copy_engines_ ? "copy engines" : "NCCL";
  // This rank's own block: step 0 reads k and v where they are. Over copy engines its pieces go
  // straight from k, v and the segment ids into the next rank's window (packing them first cost the
  // first step's kernel about 1%; bench/RESULTS.md), with the trailer sealed over the pieces; the
  // window's alignment gaps, which no piece writes, are zeroed by their owner, so forwarded blocks
  // carry zeros there. NCCL sends one buffer, so for it the block is packed.
  std::vector<BlockPiece> own_pieces = {{in.k.data(), 0, in.k.nbytes()}, {in.v.data(), layout.v_offset, in.v.nbytes()}};
  if (in.kv_segment_ids.defined())
    own_pieces.push_back({in.kv_segment_ids.data(), layout.segments_offset, in.kv_segment_ids.nbytes()});
  const bool send_pieces = peers_ && std::all_of(own_pieces.begin(), own_pieces.end(), [](const BlockPiece& piece) {
    return reinterpret_cast<uintptr_t>(piece.data) % 16 == 0;  // what the checksum kernel reads
  });
  auto prepare_own_block = [&] {
    cudaStream_t comm_stream = nccl->stream();
    if (!blocks_free_) blocks_free_ = std::make_unique<CudaEvent>();
    nccl->stream_wait(blocks_free_->get());  // the previous call's last reads (maybe on another stream)
    nccl->stream_wait(inputs_ready.get());
    if (verify) RA_CUDA_CHECK(cudaMemsetAsync(checks_.data<char>(), 0, 2 * n * sizeof(BlockTrailer), comm_stream));
    // The checksum covers the gaps: zeros in the buffer this rank's packed block leaves from, and in
    // the window it receives the first block into (the previous rank may send it as pieces).
    auto zero_gaps = [&](char* buffer, int64_t rows) {
      for (const KvBlockLayout::Span gap : layout.padding(in, rows))
        RA_CUDA_CHECK(cudaMemsetAsync(buffer + gap.offset, 0, gap.bytes, comm_stream));
    };
    if (!send_pieces) zero_gaps(base[0], local_kv);
    if (peers_) zero_gaps(base[1], int64_t(source_keys_[size_t(comm.previous())].size()));
    if (send_pieces) {
      if (verify) seal_pieces_cuda(own_trailer, own_pieces, uint32_t(rank), comm_stream);
      return;
    }
    for (const BlockPiece& piece : own_pieces)
      RA_CUDA_CHECK(cudaMemcpyAsync(base[0] + piece.offset, piece.data, piece.bytes, cudaMemcpyDeviceToDevice, comm_stream));
    if (verify) seal_block_cuda(base[0], payload, uint32_t(rank), comm_stream);
  };
  // The first shift's pieces (copy engines): the block's, then its trailer, into the window at `offset`.
  auto own_block_pieces = [&](size_t offset) {
    std::vector<PeerCopyRing::Piece> pieces;
    for (const BlockPiece& piece : own_pieces) pieces.push_back({piece.data, offset + piece.offset, piece.bytes});
    if (verify) pieces.push_back({own_trailer, offset + payload, sizeof(BlockTrailer)});
    return pieces;
  };

  stats_ = RingStats{};
  step_times_pending_ = false;  // the events are recorded again
  stats_.transport = ring_transport_name(copy_engines_ ? RingTransport::kCopyEngines : RingTransport::kNccl);
  const bool timed = ctx_.time_steps;
  if (timed)
    while (step_events_.size() < 4 * size_t(n)) step_events_.push_back(std::make_unique<CudaEvent>(true));
  int cur = 0, kernels_queued = 0;
  for (int step = 0; step < n; ++step) {
    inject_process_fault(ctx_.fault, rank, step);
    const int src = ring_source_rank(rank, step, n);
    set_activity("ring step %d of %d (%s): exchanging with ranks %d / %d, then the K/V block of rank %d", step, n,
                 transport, comm.previous(), comm.next(), src);
    // The compute is queued before the exchange (queuing NCCL work takes the host a while and the
    // compute stream would idle meanwhile), but the exchange waits only for the previous compute,
    // which last read the buffer it receives into (at step 0: the previous call's, see prepare_own_block).
    const bool exchange = step + 1 < n;
    if (exchange && step > 0) {
      nccl->stream_wait(compute_done.get());
      if (verify) nccl->stream_wait(checked[1 - cur].get());  // the checksum of the block it replaces
    }
    if (step > 0) RA_CUDA_CHECK(cudaStreamWaitEvent(stream_, arrived_block.get(), 0));  // the block it reads
    const std::vector<int64_t>& k_host = source_keys_[size_t(src)];
    const auto t0 = std::chrono::steady_clock::now();
    if (timed) step_event(step, 0)->record(stream_);
    if (query_positions_.empty() || ring_block_skipped(q_lo_, q_hi_, k_host, params)) {
      ++stats_.skipped;
    } else {
      const AttentionInputs block =
          step > 0 ? layout.view(in, base[cur], int64_t(k_host.size()), MemoryKind::kCuda) : in;
      const DevicePositions block_pos{pos.q, pos.k + key_offsets_[size_t(src)], pos.total_keys, pos.keys_sorted,
                                      query_positions_.data(), k_host.data()};
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
    if (verify && step + 1 == n) {
      try {
        check_arrived_blocks(checks_, n, rank, payload, in, transport, check_stream_->get());
      } catch (...) {
        cudaStreamSynchronize(stream_);
        throw;
      }
    }
    std::unique_ptr<PendingExchange> pending;
    if (exchange) {
      if (step == 0) prepare_own_block();
      if (timed) step_event(step, 2)->record(nccl->stream());
      const size_t window_offset = size_t(1 - cur) * stride;
      if (step == 0 && send_pieces) pending = peers_->shift(own_block_pieces(window_offset), step, ctx_.step_timeout);
      else if (peers_) pending = peers_->shift(base[cur], window_offset, bytes, step, ctx_.step_timeout);
      else pending = nccl->ring_shift(base[cur], base[1 - cur], bytes, step);
      if (timed) step_event(step, 3)->record(nccl->stream());
      // The corruption fault lands before the check, as a flip in flight would.
      char* got = base[1 - cur];
      if (const std::optional<size_t> at = corrupted_byte(ctx_.fault, rank, step, payload))
        flip_byte_cuda(got, *at, nccl->stream());
      arrived_block.record(nccl->stream());
      if (verify) {
        // The block that arrived is checked on a stream of its own at the compute stream's priority:
        // its blocks then run after the attention kernel's last ones are dispatched, on the SMs its
        // last wave leaves idle, instead of taking SMs from it at the communicator's high priority.
        // Only the transfer that overwrites this buffer (two steps on) waits for it.
        RA_CUDA_CHECK(cudaStreamWaitEvent(check_stream_->get(), arrived_block.get(), 0));
        RA_CUDA_CHECK(cudaMemcpyAsync(&arrived[step + 1], got + payload, sizeof(BlockTrailer), cudaMemcpyDeviceToDevice,
                                      check_stream_->get()));
        block_checksum_cuda(got, payload, &recomputed[step + 1].checksum, check_stream_->get());
        checked[1 - cur].record(check_stream_->get());
      }
    }
    if (pending) {
      const auto t1 = std::chrono::steady_clock::now();
      set_activity("ring step %d of %d (%s): waiting for the K/V block from rank %d (ours going to rank %d)", step, n,
                   transport, comm.previous(), comm.next());
      pending->wait(ctx_.step_timeout);
      stats_.wait_seconds += seconds_since(t1);
      cur = 1 - cur;
    }
    ++stats_.steps;
    if (ctx_.on_step) ctx_.on_step(step, n);
  }
  if (blocks_free_) blocks_free_->record(stream_);
  step_times_pending_ = timed;  // read from the events by last_stats(), once the caller has waited
}

CudaEvent* RingAttentionCuda::step_event(int step, int which) const {
  return step_events_[4 * size_t(step) + size_t(which)].get();
}

const RingStats& RingAttentionCuda::last_stats() const {
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
