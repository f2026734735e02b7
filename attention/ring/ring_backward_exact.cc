// The deterministic ring's backward (--deterministic): the same trip as the f32 backward
// (carry_gradients), carrying fixed-point dK/dV sums (int128, four times the f32 traffic) instead of
// f32 ones, with the terms of attention/cpu/exact_backward_cpu.h. Every sum is of integers, so the
// gradients are the same bits for any ring size and layout, as the deterministic forward's O and LSE.
#include <string>
#include <vector>

#include "attention/cpu/exact_backward_cpu.h"
#include "attention/ring/gradient_trip.h"
#include "attention/ring/ring.h"
#include "runtime/error.h"

namespace ra {
namespace {

void add_sums(Fixed* dst, const Fixed* src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] += src[i];
}

// Exact sums over the ring of int128 values: each splits into its signed top 64 bits and the two 32-bit
// halves of its bottom 64, summed as int64 (no carry lost for up to 2^31 ranks) and joined again.
void all_reduce_fixed(Communicator& comm, std::vector<Fixed>& sums) {
  const size_t n = sums.size();
  std::vector<int64_t> chunks(3 * n);
  for (size_t i = 0; i < n; ++i) {
    const auto low = static_cast<uint64_t>(sums[i]);
    chunks[i] = int64_t(sums[i] >> 64);
    chunks[n + i] = int64_t(low >> 32);
    chunks[2 * n + i] = int64_t(low & 0xffffffffu);
  }
  comm.all_reduce(chunks.data(), chunks.size(), ReduceOp::kSum);
  for (size_t i = 0; i < n; ++i)
    sums[i] = Fixed(chunks[i]) * (Fixed(1) << 64) + Fixed(chunks[n + i]) * (Fixed(1) << 32) + Fixed(chunks[2 * n + i]);
}

}  // namespace

void RingAttention::accumulate_backward_exact(const AttentionInputs& in, const TokenPositions& pos,
                                              const AttentionParams& params, const BackwardInputs& grad,
                                              const GradViews& acc) const {
  Communicator& comm = *ctx_.comm;
  // The units of every sum come from bounds over the whole sequence: the same on every rank.
  MagnitudeBounds bounds = MagnitudeBounds::of(in, grad);
  static_assert(sizeof(MagnitudeBounds) == 5 * sizeof(int64_t));
  comm.all_reduce(&bounds.q, 5, ReduceOp::kMax);
  static const char* const kNames[5] = {"q", "k", "v", "do", "o (through delta = rowsum(do * o))"};
  check_finite_for_exact_sums(&bounds.q, kNames, 5);
  // A shared bias's sums are formed on every rank, whether or not this one asked for its gradient (their sum
  // over the ring is collective); a bias of this rank's rows only where its gradient is asked for.
  const bool shared_bias = comm.size() > 1 && bias_shared_over_ring(comm, in);
  ExactBackward exact(in, params, bounds, /*with_dbias=*/shared_bias || acc.dbias.defined());
  const int64_t slot_rows = schedule_.slot_rows();
  const size_t dk_bytes = exact.dk_count(slot_rows) * sizeof(Fixed);
  auto dk_of = [](char* sums) { return reinterpret_cast<Fixed*>(sums); };
  auto dv_of = [&](char* sums) { return reinterpret_cast<Fixed*>(sums + dk_bytes); };
  GradientTrip trip;
  trip.wire_bytes = trip.part_bytes = dk_bytes + exact.dv_count(slot_rows) * sizeof(Fixed);
  trip.wire_name = "dK/dV fixed-point sums (int128, " + std::to_string(trip.wire_bytes) + " bytes)";
  trip.compute = [&](const AttentionInputs& block, const TokenPositions& block_pos, char* part, int64_t) {
    exact.add_block(block, block_pos, grad, dk_of(part), dv_of(part));
  };
  trip.add_part = [&](char* wire, char* part, int64_t rows) {
    add_sums(dk_of(wire), dk_of(part), exact.dk_count(rows));
    add_sums(dv_of(wire), dv_of(part), exact.dv_count(rows));
  };
  trip.take_home = [&](char* wire, int64_t) {
    exact.dk_into(dk_of(wire), acc.dk);
    exact.dv_into(dv_of(wire), acc.dv);
  };
  carry_gradients(in, pos, params, ctx_.fault.in_pass(FaultPlan::Pass::kBackward), trip);
  exact.dq_into(acc.dq);
  if (shared_bias) all_reduce_fixed(comm, exact.dbias_sums());
  if (acc.dbias.defined()) exact.dbias_into(acc.dbias);  // undefined: its gradient not asked for
  if (in.sinks.defined()) {
    std::vector<Fixed> sums = exact.sinks_sums(in.sinks, grad.lse, grad.delta);
    all_reduce_fixed(comm, sums);
    exact_dsinks_ = exact.dsinks(sums);
  }
}

}  // namespace ra
