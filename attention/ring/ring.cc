// Ring attention on host memory: pack the local K/V (and kv segment ids) into one buffer and seal it
// (the rank it started on, its checksum: attention/ring/block_seal.h), then N steps of { start the shift of the held
// block to the next rank; fold Q against it; wait; check the block that arrived }.
#include "attention/ring/ring.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "attention/ring/host_block.h"
#include "attention/ring/ring_call_start.h"
#include "attention/cpu/exact_sum_cpu.h"
#include "attention/registry.h"
#include "runtime/activity.h"
#include "runtime/error.h"

namespace ra {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

RingTransport parse_ring_transport(const std::string& name) {
  if (name == "auto") return RingTransport::kAuto;
  if (name == "nccl") return RingTransport::kNccl;
  if (name == "copy-engines") return RingTransport::kCopyEngines;
  RA_FAIL("ring transport '", name, "' is unknown: expected auto, nccl or copy-engines");
}

DType parse_gradient_wire(const std::string& text, const char* option) {
  RA_CHECK(text == "f32" || text == "bf16", option, " '", text, "': expected f32 or bf16");
  return text == "bf16" ? DType::kBF16 : DType::kF32;
}

void check_ring_modes(bool deterministic, DType gradient_wire, Backend backend) {
  // The host ring's exact sums travel as fixed-point integers: a bf16 wire would change nothing.
  RA_CHECK(!deterministic || gradient_wire == DType::kF32 || backend == Backend::kCuda, "gradient wire ",
           dtype_name(gradient_wire), " with deterministic on the host ring: its dK/dV travel as exact fixed-point "
           "sums, the same bits on any ring, so the wire would change nothing; pass one of the two");
}

const char* ring_transport_name(RingTransport transport) {
  switch (transport) {
    case RingTransport::kAuto: return "auto";
    case RingTransport::kNccl: return "nccl";
    case RingTransport::kCopyEngines: return "copy-engines";
  }
  return "?";
}

TokenPositions ring_positions(const RingContext& ctx) {
  const int n = ctx.comm->size(), r = ctx.comm->rank();
  TokenPositions pos;
  pos.q = layout_query_positions(ctx.layout, ctx.global_q_len, ctx.global_kv_len, n, r);
  pos.k = layout_indices(ctx.layout, ctx.global_kv_len, n, r);
  pos.total_keys = ctx.global_kv_len;
  return pos;
}

RingSchedule ring_schedule(const RingContext& ctx) {
  RA_CHECK(ctx.comm != nullptr, "the ring implementation needs a communicator (RingContext::comm)");
  return RingSchedule(ctx.layout, ctx.global_q_len, ctx.global_kv_len, ctx.comm->size(), ctx.comm->rank());
}

namespace {

// A (B, rows, H, X) section of `t`'s dtype and batch / head / last dims.
Shape with_rows(const TensorView& t, int64_t rows) {
  Shape shape = t.shape();
  shape[1] = rows;
  return shape;
}

size_t section_bytes(const TensorView& t, int64_t rows) {
  return t.defined() ? size_t(with_rows(t, rows).numel()) * dtype_size(t.dtype()) : 0;
}

}  // namespace

KvBlockLayout::KvBlockLayout(const AttentionInputs& in, int64_t slot_rows, size_t align) {
  auto aligned = [align](size_t x) { return (x + align - 1) / align * align; };
  v_offset = aligned(section_bytes(in.k, slot_rows));
  segments_offset = v_offset + aligned(section_bytes(in.v, slot_rows));
  payload = segments_offset + aligned(section_bytes(in.kv_segment_ids, slot_rows));
}

std::vector<KvBlockLayout::Span> KvBlockLayout::padding(const AttentionInputs& in, int64_t rows) const {
  const size_t k_end = section_bytes(in.k, rows), v_end = v_offset + section_bytes(in.v, rows);
  const size_t segments_end = segments_offset + section_bytes(in.kv_segment_ids, rows);
  std::vector<Span> gaps;
  for (Span gap : {Span{k_end, v_offset - k_end}, Span{v_end, segments_offset - v_end}, Span{segments_end, payload - segments_end}})
    if (gap.bytes > 0) gaps.push_back(gap);
  return gaps;
}

AttentionInputs KvBlockLayout::view(const AttentionInputs& in, char* base, int64_t rows, MemoryKind memory) const {
  AttentionInputs block = in;
  block.k = TensorView(base, in.k.dtype(), with_rows(in.k, rows), memory);
  block.v = TensorView(base + v_offset, in.v.dtype(), with_rows(in.v, rows), memory);
  if (in.kv_segment_ids.defined())
    block.kv_segment_ids = TensorView(base + segments_offset, DType::kI32, with_rows(in.kv_segment_ids, rows), memory);
  return block;
}

RingAttention::RingAttention(RingContext ctx, Backend backend)
    : ctx_(std::move(ctx)), schedule_(ring_schedule(ctx_)), backend_(backend) {
  RA_CHECK(ctx_.local_impl != "ring", "the ring's local kernel cannot be 'ring'");
  RA_CHECK(ctx_.transport == RingTransport::kAuto, "ring transport ", ring_transport_name(ctx_.transport),
           " moves the GPU ring's blocks; the host ring (backend ", backend_name(backend), ") sends them over MPI");
  check_ring_modes(ctx_.deterministic, ctx_.gradient_wire, backend);
  local_ = AttentionRegistry::builtin().create(ctx_.local_impl, backend);
}

void RingAttention::accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                               Carry& carry) const {
  check_alike([&] { check_shard(in, pos); });
  const RingCallStart start(*ctx_.comm, ctx_.step_timeout, started_, "ring forward");
  stats_ = RingStats{};
  stats_.transport = ctx_.comm->backend_name();
  const FaultPlan forward_fault = ctx_.fault.in_pass(FaultPlan::Pass::kForward);
  if (!ctx_.deterministic) {
    rotate_blocks(in, pos, params, forward_fault, [&](const AttentionInputs* block, const TokenPositions& block_pos, int, int) {
      if (block) local_->accumulate(*block, block_pos, params, carry);
    });
    return;
  }
  // Bitwise-reproducible: the global bound of |v| (an exact max), then two trips around the ring.
  int64_t exponents[3] = {magnitude_exponent(in.q), magnitude_exponent(in.k), magnitude_exponent(in.v)};
  ctx_.comm->all_reduce(exponents, 3, ReduceOp::kMax);
  static const char* const kNames[3] = {"q", "k", "v"};
  check_finite_for_exact_sums(exponents, kNames, 3);
  ExactSum exact(carry.batch, carry.heads, carry.rows, carry.value_dim, int(exponents[2]));
  rotate_blocks(in, pos, params, forward_fault, [&](const AttentionInputs* block, const TokenPositions& block_pos, int, int) {
    if (block) exact.max_pass(*block, block_pos, params);
  });
  rotate_blocks(in, pos, params, forward_fault, [&](const AttentionInputs* block, const TokenPositions& block_pos, int, int) {
    if (block) exact.sum_pass(*block, block_pos, params);
  });
  exact.merge_into(carry);
}

void RingAttention::check_shard(const AttentionInputs& in, const TokenPositions& pos) const {
  const int rank = ctx_.comm->rank();
  const int64_t local_kv = schedule_.rows(rank);
  RA_CHECK(in.k.dim(1) == local_kv, "k dimension 1 (kv_len) is ", in.k.dim(1), " on rank ", rank,
           ", expected the local shard of ", local_kv, " rows");
  // The schedule skips blocks by the layout's query positions: the caller's must be those.
  RA_CHECK(pos.q == schedule_.query_positions(), "ring: the query positions passed on rank ", rank,
           " are not this rank's under the ", layout_name(ctx_.layout), " layout (use ring_positions(ctx))");
}

void RingAttention::refuse_call(const std::exception_ptr& refused) const {
  join_refused_call(*ctx_.comm, ctx_.step_timeout, started_, refused);
}

void RingAttention::rotate_blocks(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                                  const FaultPlan& fault, const BlockVisitor& visit) const {
  Communicator& comm = *ctx_.comm;
  const int n = comm.size(), rank = comm.rank();
  // One contiguous buffer per block: k, v and the kv segment ids packed tight, in sections sized for
  // the longest shard (shards of a length that does not divide differ by a row), then the seal.
  const KvBlockLayout layout(in, schedule_.slot_rows(), 1);
  const size_t payload = layout.payload, bytes = sealed_bytes(payload);
  BlockBuffers buffers(payload, 2);
  char* const first = buffers[0];
  pack_rows(in.k, first);
  pack_rows(in.v, first + layout.v_offset);
  if (in.kv_segment_ids.defined()) {
    const TensorView& seg = in.kv_segment_ids;
    for (int64_t b = 0; b < seg.dim(0); ++b)
      for (int64_t s = 0; s < seg.dim(1); ++s)
        std::memcpy(first + layout.segments_offset + size_t(b * seg.dim(1) + s) * 4,
                    seg.data_as<int32_t>() + b * seg.stride(0) + s * seg.stride(1), 4);
  }
  seal_block(buffers[0], rank, payload, ctx_.verify_blocks);
  const std::string block_name = "K/V block (k " + in.k.shape().str() + " and v " + in.v.shape().str() + ")";
  // A rank that holds no query (fewer tokens than ranks) skips every block (the schedule) but still forwards it.

  int cur = 0;
  for (int step = 0; step < n; ++step) {
    // Phase 1: start moving the block we hold to the next rank (except on the last step).
    inject_process_fault(fault, rank, step);
    const int src = schedule_.source(step);
    if (step + 1 < n)
      set_activity("ring step %d of %d: folding the K/V block of rank %d (next block in flight from rank %d)", step, n,
                   src, comm.previous());
    else
      set_activity("ring step %d of %d: folding the K/V block of rank %d (last step, nothing in flight)", step, n, src);
    std::unique_ptr<PendingExchange> pending;
    if (step + 1 < n) pending = comm.ring_shift(buffers[cur], buffers[1 - cur], bytes, step);
    // Phase 2: fold our queries against the held block, unless no pair in it can be visible.
    TokenPositions block_pos;
    block_pos.q = pos.q;
    block_pos.total_keys = ctx_.global_kv_len;
    const auto t0 = std::chrono::steady_clock::now();
    block_pos.k = schedule_.keys(src);
    if (schedule_.skipped(src, params)) {
      ++stats_.skipped;
      visit(nullptr, block_pos, step, src);
    } else {
      const AttentionInputs block = layout.view(in, buffers[cur], int64_t(block_pos.k.size()), MemoryKind::kHost);
      visit(&block, block_pos, step, src);
    }
    stats_.compute_seconds += seconds_since(t0);
    // Phase 3: the next block must have arrived before the next step reads it.
    if (pending) {
      const auto t1 = std::chrono::steady_clock::now();
      set_activity("ring step %d of %d: waiting for the K/V block from rank %d (ours going to rank %d)", step, n,
                   comm.previous(), comm.next());
      try {
        pending->wait(ctx_.step_timeout);
      } catch (...) {
        // A half-done exchange cannot be cancelled: MPI may still write into these buffers until the
        // job is aborted, so they are deliberately not freed on the way out.
        buffers.abandon();
        throw;
      }
      stats_.wait_seconds += seconds_since(t1);
      cur = 1 - cur;
      inject_corruption(fault, rank, step, buffers[cur], payload);
      check_arrived_block(buffers[cur], payload, ctx_.verify_blocks, rank, comm.previous(), step, schedule_.source(step + 1),
                          block_name);
    }
    ++stats_.steps;
    if (ctx_.on_step) ctx_.on_step(step, n);
  }
}

}  // namespace ra
