// The host ring's backward. K/V blocks rotate exactly as in the forward (rotate_blocks); beside them the
// f32 dK/dV accumulator of each block travels one step behind it on buffers of its own: at step s a rank
// computes its part of the held block's dK/dV into a zeroed partial while the accumulator of that block
// (what the ranks before it added) arrives from the previous rank; it then adds the partial in and
// passes the sum on at the next step, resealed. After the last step each accumulator is one hop from
// its owner, and a last shift brings it home. The transfers overlap the next step's compute; the sums
// run in a fixed order, so a given ring size and layout give the same bits on every run.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "attention/backward.h"
#include "attention/ring/gradient_block.h"
#include "attention/ring/gradient_trip.h"
#include "attention/ring/host_block.h"
#include "attention/ring/ring.h"
#include "attention/ring/ring_call_start.h"
#include "runtime/activity.h"
#include "runtime/error.h"

namespace ra {
namespace {

constexpr int kGradientTag = 1 << 14;  // the accumulators' tags, apart from the K/V blocks' (the step)

void add_floats(float* dst, const float* src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] += src[i];
}

// The accumulator in flight (f32, or bf16 on a bf16 wire) += this rank's f32 part, same shape.
void add_into_wire(const TensorView& wire, const TensorView& part) {
  const size_t count = size_t(part.numel());
  if (wire.dtype() == DType::kF32) return add_floats(wire.data_as<float>(), part.data_as<float>(), count);
  std::vector<float> sum(count);
  convert_to_f32(wire.data(), wire.dtype(), sum.data(), count);
  add_floats(sum.data(), part.data_as<float>(), count);
  convert_from_f32(sum.data(), wire.data(), wire.dtype(), count);
}

// acc (f32) += the accumulator that came home (f32 or bf16), same shape.
void add_from_wire(const TensorView& acc, const TensorView& wire) {
  const size_t count = size_t(acc.numel());
  if (wire.dtype() == DType::kF32) return add_floats(acc.data_as<float>(), wire.data_as<float>(), count);
  std::vector<float> values(count);
  convert_to_f32(wire.data(), wire.dtype(), values.data(), count);
  add_floats(acc.data_as<float>(), values.data(), count);
}

}  // namespace

bool bias_shared_over_ring(Communicator& comm, const AttentionInputs& in) {
  if (!in.bias.defined()) return false;
  // Decided alike on every rank: a rank holding other than one query row tells a broadcast row from its own rows.
  const int64_t bias_rows = in.bias.rank() >= 2 ? in.bias.dim(in.bias.rank() - 2) : 1;
  int64_t shared = bias_rows == 1 && in.q.dim(1) != 1;
  comm.all_reduce(&shared, 1, ReduceOp::kMax);
  return shared != 0;
}

void RingAttention::carry_gradients(const AttentionInputs& in, const TokenPositions& pos,
                                    const AttentionParams& params, const FaultPlan& fault,
                                    const GradientTrip& trip) const {
  Communicator& comm = *ctx_.comm;
  const int n = comm.size(), rank = comm.rank();
  const size_t payload = trip.wire_bytes, bytes = sealed_bytes(payload);
  // [sending] the accumulator passed on, [arriving] the one coming in, [partial] this step's part.
  BlockBuffers buffers(std::max(trip.part_bytes, trip.wire_bytes), 3);
  int sending = 0, arriving = 1;
  char* const partial = buffers[2];
  // Passes [sending] on and receives into [arriving] (tagged apart from the K/V blocks' shifts).
  auto start_shift = [&](int step) {
    return comm.ring_shift(buffers[sending], buffers[arriving], bytes, kGradientTag + step);
  };
  // Waits for it, checks what came (the accumulator of `origin`'s block) and makes it the one to send.
  auto finish_shift = [&](PendingExchange& pending, int step, int origin) {
    set_activity("ring backward step %d of %d: waiting for the dK/dV of rank %d's block from rank %d", step, n, origin,
                 comm.previous());
    try {
      pending.wait(ctx_.step_timeout);
    } catch (...) {
      buffers.abandon();  // MPI may still write into them until the job ends
      throw;
    }
    if (step == n) inject_corruption(fault, rank, n, buffers[arriving], payload);  // the last hop's accumulator
    check_arrived_block(buffers[arriving], payload, ctx_.verify_blocks, rank, comm.previous(), step, origin, trip.wire_name);
    std::swap(sending, arriving);
  };

  rotate_blocks(in, pos, params, fault, [&](const AttentionInputs* block, const TokenPositions& block_pos, int step, int src) {
    const int64_t rows = int64_t(block_pos.k.size());
    // The accumulator of the block held now left the previous rank at the end of its last step.
    std::unique_ptr<PendingExchange> pending;
    if (step > 0) pending = start_shift(step);
    if (block != nullptr) {
      std::memset(partial, 0, trip.part_bytes);
      trip.compute(*block, block_pos, partial, rows);
    }
    if (pending) {
      finish_shift(*pending, step, src);  // what arrived goes on, with our part added
    } else {
      std::memset(buffers[sending], 0, payload);  // step 0: our own block, nobody has added yet
    }
    if (block != nullptr) trip.add_part(buffers[sending], partial, rows);
    seal_block(buffers[sending], src, payload, ctx_.verify_blocks);
  });
  // The last hop: the accumulator held now belongs to the next rank; ours comes from the previous one.
  if (n > 1) finish_shift(*start_shift(n), n, rank);
  trip.take_home(buffers[sending], in.k.dim(1));
}

void RingAttention::accumulate_backward(const AttentionInputs& in, const TokenPositions& pos,
                                        const AttentionParams& params, const BackwardInputs& grad,
                                        const GradViews& acc) const {
  check_alike([&] {
    RA_CHECK(local_->has_backward(), "ring backward: the local implementation '", local_->name(), "' has no backward");
    check_shard(in, pos);
  });
  const RingCallStart start(*ctx_.comm, ctx_.step_timeout, started_, "ring backward");
  stats_ = RingStats{};
  stats_.transport = ctx_.comm->backend_name();
  if (ctx_.deterministic) return accumulate_backward_exact(in, pos, params, grad, acc);
  Communicator& comm = *ctx_.comm;
  const int n = comm.size();
  const GradientBlock layout{in.k.dim(0), in.k.dim(2), in.k.dim(3), in.v.dim(3),
                             schedule_.slot_rows(),
                             n > 1 ? ctx_.gradient_wire : DType::kF32};  // a ring of one has no wire
  const GradientBlock part_layout = layout.in_f32();  // this step's part: always f32
  // A shared bias's gradient: this rank's part in a zeroed tensor, summed over the ring at the end (on every
  // rank alike, whether or not this one asked for the gradient: the sum is collective).
  const bool shared_bias = n > 1 && bias_shared_over_ring(comm, in);
  Tensor dbias_part;
  if (shared_bias) dbias_part = Tensor(DType::kF32, in.bias.shape());  // zeroed
  const TensorView dbias = shared_bias ? dbias_part.view() : acc.dbias;
  GradientTrip trip;
  trip.wire_bytes = layout.payload();
  trip.part_bytes = part_layout.payload();
  trip.wire_name = "dK/dV accumulator (" + std::string(dtype_name(layout.dtype)) + ", " +
                   std::to_string(trip.wire_bytes) + " bytes)";
  trip.compute = [&](const AttentionInputs& block, const TokenPositions& block_pos, char* part, int64_t rows) {
    const GradViews views{acc.dq, part_layout.dk_view(part, rows, MemoryKind::kHost),
                          part_layout.dv_view(part, rows, MemoryKind::kHost), dbias};
    local_->accumulate_backward(block, block_pos, params, grad, views);
  };
  trip.add_part = [&](char* wire, char* part, int64_t rows) {
    add_into_wire(layout.dk_view(wire, rows, MemoryKind::kHost), part_layout.dk_view(part, rows, MemoryKind::kHost));
    add_into_wire(layout.dv_view(wire, rows, MemoryKind::kHost), part_layout.dv_view(part, rows, MemoryKind::kHost));
  };
  trip.take_home = [&](char* wire, int64_t rows) {
    add_from_wire(acc.dk, layout.dk_view(wire, rows, MemoryKind::kHost));
    add_from_wire(acc.dv, layout.dv_view(wire, rows, MemoryKind::kHost));
  };
  carry_gradients(in, pos, params, ctx_.fault.in_pass(FaultPlan::Pass::kBackward), trip);
  if (shared_bias) {
    all_reduce_sum_f64(comm, dbias_part.data<float>(), size_t(dbias_part.numel()));
    if (acc.dbias.defined())
      add_floats(acc.dbias.data_as<float>(), dbias_part.data<float>(), size_t(dbias_part.numel()));
  }
}

void RingAttention::reduce_sequence_gradients(Gradients& g) const {
  if (ctx_.deterministic) {  // the exact sums of accumulate_backward_exact, already over the whole ring
    if (g.dsinks.defined()) g.dsinks = std::move(exact_dsinks_);
    return;
  }
  if (g.dsinks.defined()) all_reduce_sum_f64(*ctx_.comm, g.dsinks.data<float>(), size_t(g.dsinks.numel()));
}

}  // namespace ra
