// The options every Python call takes (the seeds' names) and the inputs they describe.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "arrays.h"
#include "attention/attention_impl.h"
#include "attention/backward.h"
#include "attention/inputs.h"
#include "attention/params.h"
#include "runtime/memory.h"

namespace ra::python {

using OptionalArray = std::optional<AnyArray>;

struct CallOptions {
  bool causal = false;
  std::optional<std::pair<int64_t, int64_t>> window;  // (left, right); -1: unbounded on that side
  float softcap = 0, scale = 0, dropout = 0;
  uint64_t dropout_seed = 0;
  // The global index of this call's first batch entry and query head, where the caller shards them
  // (data / tensor parallel): dropout keys its decisions by global indices (AttentionParams).
  int64_t batch_offset = 0, head_offset = 0;
  FlashKernel flash_kernel = FlashKernel::kAuto;  // "auto" | "mma_sync" | "wgmma" (CUDA flash_attn2)
  bool deterministic = false;  // the backward's sums in a fixed order (AttentionParams::deterministic)
  OptionalArray sinks, bias, mask, segment_ids, kv_segment_ids;
  uint64_t mask_identity = 0;  // AttentionInputs::mask_identity: the caller's name for the mask's bytes
};

// The keyword options of a Python call (a dict: causal, window, softcap, scale, dropout, dropout_seed, batch_offset, head_offset,
// flash_kernel, deterministic, sinks, bias, mask, mask_identity, segment_ids, kv_segment_ids); an unknown name is an error listing the
// known ones.
CallOptions options_from(const nb::dict& options);

AttentionParams params_of(const CallOptions& o);
// q, k, v and the optional arrays as views (no copies), each checked for its rank and for living where
// q does (`where`: host memory or one CUDA device).
AttentionInputs inputs_of(const AnyArray& q, const AnyArray& k, const AnyArray& v, const CallOptions& o,
                          const Placement& where);

// The forward's o and lse as views (no copies), checked to live with q.
ForwardViews forward_views_of(const AnyArray& o, const AnyArray& lse, const Placement& where);

// The caller's output arrays, written in place by the call: `out` is None (nothing given) or a sequence
// (o, lse) / (dq, dk, dv[, dbias][, dsinks]), each checked to live where q does. The backward's dbias and
// dsinks entries come together, one for each of the bias and the sinks `in` has, or not at all (then
// returned); None there: that gradient is not formed.
std::optional<ForwardViews> forward_out_of(nb::handle out, const Placement& where);
std::optional<GradViews> gradients_out_of(nb::handle out, const AttentionInputs& in, const Placement& where);

// What a call returns: o, or (o, lse) with return_lse; then (dq, dk, dv[, dbias][, dsinks]) (dbias and
// dsinks where `in` has a bias / sinks). The caller's own `out` arrays (or None) where given, the call's
// results otherwise, as arrays of `like`'s framework on `where`.
nb::object forward_result(AttentionOutput& result, nb::handle out, bool return_lse, nb::handle like,
                          const Placement& where);
nb::object gradients_result(Gradients& g, nb::handle out, const AttentionInputs& in, nb::handle like,
                            const Placement& where);

// Where a call runs: q's memory; on a CUDA device that device is current and the work is ordered on
// `stream` (a cudaStream_t as an integer, 0 for the legacy default stream), as DLPack's producer /
// consumer contract: queued on a side stream that starts after the caller's work and that the caller's
// stream waits for (runtime/memory.h says why).
struct CallDevice {
  CallDevice(const Placement& where, uintptr_t stream);
  Backend backend() const { return where.on_device() ? Backend::kCuda : Backend::kCpu; }
  bool captured() const { return side && side->captured(); }  // into a CUDA graph (runtime/graph_capture.h)
  void bind(AttentionImpl& impl) const;  // the side stream, on a device
  Placement where;
  std::optional<ScopedCudaDevice> device;
  std::optional<SideStream> side;  // after `device`: made on it, ended before it
};

// Refuses, by name and before any work, a call on a stream being captured into a CUDA graph that a replay
// could not repeat faithfully: the ring's (it exchanges blocks with its peers from the host), dropout
// (every replay would draw the captured call's mask again), and a backward's gradient returned in memory of
// ringattn's own, which the graph cannot own (`into`: the backward's out=, null where none was given). No-op
// for a stream not capturing.
void check_capturable(const Placement& where, uintptr_t stream, const AttentionInputs& in, const AttentionParams& params,
                      bool backward, const GradViews* into, bool ring);

// The ring bindings (ring.cc): ring_attention, ring_attention_backward, layout_indices.
void bind_ring(nb::module_& m);

}  // namespace ra::python
