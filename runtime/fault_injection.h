// Built-in fault injection for the failure tests. A ring injects the plan of its RingContext::fault
// (none by default); the CLI reads it from one environment variable (launch/job.cc, make_impl):
//   RINGATTN_FAULT=<kind>:rank=<r>:step=<s>[:ms=<m>][:pass=forward|backward]
// kinds: kill (SIGKILL), term (SIGTERM), abort (std::abort), exit (exit code 9), stall (sleep m ms,
// default 1 hour), corrupt (flip a high byte of a value in the block received at that step, to be
// caught by the block checksum), short (send half of the block at that step: the receiver must notice
// the missing bytes; host ring). With pass=, only the ring walks of that pass count (the backward's
// walk follows a forward with the same steps); the backward's step N (N ranks) is the last hop of the
// dK/dV accumulators, where corrupt flips a byte of the one that comes home. Off unless the variable is
// set; a malformed value is an error naming it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace ra {

struct FaultPlan {
  enum class Kind { kNone, kKill, kTerm, kAbort, kExit, kStall, kCorrupt, kShort };
  enum class Pass { kAny, kForward, kBackward };
  Kind kind = Kind::kNone;
  Pass pass = Pass::kAny;
  int rank = -1, step = -1;
  long ms = 3600 * 1000;

  static FaultPlan parse(const std::string& text);  // throws on a malformed value
  static FaultPlan from_environment();              // RINGATTN_FAULT, or none
  bool armed(int rank_now, int step_now) const { return kind != Kind::kNone && rank == rank_now && step == step_now; }
  // This plan for the ring walks of pass `now`: disarmed where it names the other pass.
  FaultPlan in_pass(Pass now) const {
    FaultPlan plan = *this;
    if (pass != Pass::kAny && pass != now) plan.kind = Kind::kNone;
    return plan;
  }
};

// At the start of a ring step: kill, term, abort, exit or stall when the plan names this rank and step.
void inject_process_fault(const FaultPlan& plan, int rank, int step);

// The bytes to send at a ring step: half of `bytes` when the plan says short for this rank and step.
size_t injected_send_bytes(const FaultPlan& plan, int rank, int step, size_t bytes);

// A corruption fault XORs this mask into one byte of an arrived block: a high byte (sign / exponent
// bits of a little-endian value) just past the middle of the block.
inline constexpr unsigned char kCorruptionMask = 0x40;
std::optional<size_t> corrupted_byte(const FaultPlan& plan, int rank, int step, size_t bytes);

// After a block arrived in host memory: flips that byte when the plan says corrupt for this rank and step.
void inject_corruption(const FaultPlan& plan, int rank, int step, void* block, size_t bytes);

}  // namespace ra
