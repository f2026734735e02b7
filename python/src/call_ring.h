// The ring a Python call runs on: its communicators, context and implementation, built from the caller's
// communicator (an mpi4py one, a ringattn.NcclComm, or a Python object carrying the messages) and kept
// between calls over MPI or NCCL, so that a training loop does not rebuild the GPU ring's window, mappings
// and NCCL communicator per call.
#pragma once

#include <mpi.h>
#include <nanobind/nanobind.h>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "attention/attention_impl.h"
#include "attention/ring/ring.h"
#include "call_options.h"
#include "collectives/call_agreement.h"
#include "collectives/communicator.h"
#include "python_communicator.h"

namespace ra::python {

// The caller's communicator, read with the interpreter held: the MPI communicator behind an mpi4py one,
// the NCCL communicator of a ringattn.NcclComm (CUDA arrays, no MPI: torchrun), or a Python object that
// carries the messages itself (python_communicator.h).
struct CallerComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  nb::handle python;
  std::shared_ptr<Communicator> nccl;
  int nccl_device = 0;
};
CallerComm caller_comm_of(nb::handle comm);

// What a ring is built for; two calls with equal configurations over congruent communicators share one.
struct RingConfig {
  std::string layout, local_impl;
  int64_t global_q_len = 0, global_kv_len = 0, local_q_len = 0, local_kv_len = 0;
  int64_t timeout_ms = 0;
  Backend backend = Backend::kCpu;
  int device = 0;
  bool deterministic = false;                // RingContext::deterministic (host ring)
  DType gradient_wire = DType::kF32;         // RingContext::gradient_wire
  bool operator==(const RingConfig&) const = default;
};

struct CallRing {
  // Collective over `communicator` (the GPU ring's window and mappings, or its NCCL communicator).
  CallRing(std::unique_ptr<Communicator> communicator, const RingConfig& config);
  // The GPU ring over the caller's NCCL communicator (a ringattn.NcclComm's), shared with it.
  struct CallerNccl {
    std::shared_ptr<Communicator> comm;
  };
  CallRing(CallerNccl caller, const RingConfig& config);
  std::unique_ptr<Communicator> communicator, nccl;  // nccl: the GPU ring's, where copy engines cannot run
  std::shared_ptr<Communicator> caller_nccl;         // set for a ring over a ringattn.NcclComm
  RingConfig config;
  RingContext ctx;
  std::unique_ptr<AttentionImpl> impl;
  TokenPositions pos;

 private:
  void build();  // the context's layout and modes, the implementation and this rank's positions
};

// The statistics of the process's last ring call (RingStats: steps, skipped steps, how the blocks
// travelled, host seconds computing or queuing and waiting on exchanges), or none before the first.
void remember_stats(const CallRing& ring);
std::optional<RingStats> last_ring_stats();

// What a call chooses beyond its implementation: the ring's modes.
struct RingModes {
  bool deterministic = false;
  DType gradient_wire = DType::kF32;
  std::string options;  // the call's options and head shapes (ring_options_text), compared over the ranks
};

// What every rank of a ring call passes alike: the attention options and the parts of the shapes that are
// the same on every rank (all but the rows of the shard), and which optional inputs are given.
std::string ring_options_text(const AttentionParams& params, const AttentionInputs& in);

// How the caller's ranks agree before any ring is built: an all-reduce over the caller's own communicator
// (an mpi4py one: bounded by the call's timeout; a ringattn.NcclComm or a Python object: by their own).
struct CallerAgreement {
  CallerAgreement(const CallerComm& caller, double timeout_s);
  // Collective, every ring call's first: that no rank refused its arguments (`refused`: this rank's error,
  // or null), and `least` (the options' fingerprint) replaced by its least over the ranks. Throws on a rank
  // that did not refuse where another did; returns on a refusing rank, which raises its own error.
  void agree_to_start(const std::exception_ptr& refused, int64_t (&least)[2]) const;
  AgreementAllReduce all_reduce;
  int rank = 0, size = 1;
  std::unique_ptr<PythonCommunicator> python;  // a Python object's messages: made for this call
};

// This rank refused a ring call before its arguments reached RingForCall (the Python layer's own checks):
// it joins the call's first agreement with `refused`, which the caller then raises.
void refuse_ring_call(const CallerComm& caller, double timeout_s, const std::exception_ptr& refused);

// The checks of a ring call's communicator, placement, layout and timeout (a part of its arguments'
// checks, whose error RingForCall takes as `refused`).
void check_ring_call(const CallerComm& caller, const Placement& where, const std::string& layout, double timeout_s);

// The ring for one call, bound to the call's device stream; this rank's shard checked against the layout
// before any exchange. Every rank first agrees (over the caller's communicator, each agreement bounded by
// the timeout) that none refused its arguments (`refused`: this rank's error in checking them, raised here
// after the others have learnt of it; `in` and `modes` are then not read) and that all pass the same
// options, then on the global lengths and on whether each holds a kept ring for this configuration; up to
// kKeptRings configurations are kept, later ones built for the call. `run` does the call; a ring whose call
// failed is dropped without its collective teardown (its peers may be gone).
class RingForCall {
 public:
  RingForCall(const CallerComm& caller, const std::string& layout, std::optional<int64_t> global_q_len,
              std::optional<int64_t> global_kv_len, const std::string& local_impl, double timeout_s,
              const RingModes& modes, const AttentionInputs& in, const CallDevice& device,
              const std::exception_ptr& refused);
  // Runs the call; its ring's statistics become last_ring_stats().
  template <typename Run>
  auto run(Run&& body) {
    try {
      if constexpr (std::is_void_v<decltype(body(*ring_))>) {
        body(*ring_);
        remember_stats(*ring_);
      } else {
        auto result = body(*ring_);
        remember_stats(*ring_);
        return result;
      }
    } catch (...) {
      drop();
      throw;
    }
  }

 private:
  // The kept ring `found` where every rank holds one for this configuration (agreed by min_over_ranks over
  // the caller's communicator, two values), else one that `build` makes now, kept where every rank has room.
  void keep_or_build(CallRing* found, const std::function<void(int64_t*)>& min_over_ranks,
                     const std::function<std::unique_ptr<CallRing>()>& build);
  void drop();
  CallRing* ring_ = nullptr;
  std::unique_ptr<CallRing> owned_;  // a ring for this call only
};

// Destroys every kept ring, in the order they were made (collective: every rank of their communicators calls it).
void release_kept_rings();
size_t kept_ring_count();

}  // namespace ra::python
