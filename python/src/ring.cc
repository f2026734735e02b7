// ringattn._core's ring: sequence-parallel attention over the ranks of an mpi4py communicator, each rank
// passing its shard (the layout's rows of the global sequence): the host ring for host arrays, the GPU
// ring for CUDA arrays (copy engines between ranks of one node, NCCL otherwise).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <exception>
#include <optional>
#include <stdexcept>
#include <string>

#include "arrays.h"
#include "call_options.h"
#include "call_ring.h"
#include "attention/registry.h"
#include "attention/ring/ring.h"
#include "mesh/sequence_layout.h"
#include "runtime/error.h"

namespace ra::python {
namespace {

using namespace nb::literals;

// What `checks` threw, or null: this rank's error in checking its arguments, which every rank of a ring call
// learns of before any exchange (RingForCall) instead of this rank's alone raising it.
template <typename Checks>
std::exception_ptr error_of(Checks&& checks) {
  try {
    checks();
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

// What both ring calls read of their arguments, checked (the caller's error_of keeps what they throw).
struct RingCallArguments {
  void read(const AnyArray& q, const AnyArray& k, const AnyArray& v, const CallerComm& caller,
            const std::string& layout, double timeout_s, bool deterministic, const std::string& grad_wire,
            const nb::dict& options) {
    where = placement_of(q, "q");
    check_ring_call(caller, where, layout, timeout_s);
    // The backward's wire is part of the ring's configuration: a forward and its backward share a kept ring.
    modes = RingModes{deterministic, parse_gradient_wire(grad_wire, "grad_wire")};
    call = options_from(options);
    in = inputs_of(q, k, v, call, where);  // views `call`'s arrays
    params = params_of(call);
    modes.options = ring_options_text(params, in);
  }
  Placement where;
  RingModes modes;
  CallOptions call;
  AttentionInputs in;
  AttentionParams params;
};

nb::object ring_attention(const AnyArray& q, const AnyArray& k, const AnyArray& v, nb::handle comm,
                          const std::string& layout, std::optional<int64_t> global_q_len,
                          std::optional<int64_t> global_kv_len, const std::string& local_impl, double timeout_s,
                          bool deterministic, const std::string& grad_wire, const nb::dict& options,
                          bool return_lse, nb::handle out, uintptr_t stream, nb::handle like) {
  const CallerComm caller = caller_comm_of(comm);
  RingCallArguments a;
  std::optional<ForwardViews> into;
  const std::exception_ptr refused = error_of([&] {
    a.read(q, k, v, caller, layout, timeout_s, deterministic, grad_wire, options);
    into = forward_out_of(out, a.where);
    check_capturable(a.where, stream, a.in, a.params, /*backward=*/false, nullptr, /*ring=*/true);
  });
  const Placement& where = a.where;
  const AttentionInputs& in = a.in;
  const AttentionParams& params = a.params;
  AttentionOutput result;
  {
    nb::gil_scoped_release released;  // the ring waits on its peers without holding the interpreter
    const CallDevice device(where, stream);
    RingForCall ring(caller, layout, global_q_len, global_kv_len, local_impl, timeout_s, a.modes, in, device, refused);
    ring.run([&](CallRing& r) {
      if (into) {
        r.impl->forward_into(in, params, r.pos, *into);
      } else {
        result = r.impl->forward(in, params, r.pos);
      }
    });
  }
  return forward_result(result, out, return_lse, like, where);
}

nb::object ring_attention_backward(const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& o,
                                   const AnyArray& lse, const AnyArray& d_o, const std::optional<AnyArray>& d_lse,
                                   nb::handle comm,
                                   const std::string& layout, std::optional<int64_t> global_q_len,
                                   std::optional<int64_t> global_kv_len, const std::string& local_impl,
                                   double timeout_s, bool deterministic, const std::string& grad_wire,
                                   const nb::dict& options, bool f32_gradients, nb::handle out, uintptr_t stream,
                                   nb::handle like) {
  const CallerComm caller = caller_comm_of(comm);
  RingCallArguments a;
  ForwardViews forward;
  TensorView grad_out, grad_lse;
  std::optional<GradViews> into;
  const std::exception_ptr refused = error_of([&] {
    a.read(q, k, v, caller, layout, timeout_s, deterministic, grad_wire, options);
    forward = forward_views_of(o, lse, a.where);
    grad_out = view_of(d_o, "do", 4, a.where);
    grad_lse = optional_view_of(d_lse, "dlse", 3, a.where);
    into = gradients_out_of(out, a.in, a.where);
    // The ranks sum dsinks together: every rank asks for it, or none does (compared with the options).
    if (into && a.in.sinks.defined() && !into->sinks_gradient) a.modes.options += " without dsinks";
    if (into && a.in.bias.defined() && !into->bias_gradient) a.modes.options += " without dbias";
    check_capturable(a.where, stream, a.in, a.params, /*backward=*/true, into ? &*into : nullptr, /*ring=*/true);
  });
  const Placement& where = a.where;
  const AttentionInputs& in = a.in;
  const AttentionParams& params = a.params;
  Gradients g;
  {
    nb::gil_scoped_release released;
    const CallDevice device(where, stream);
    RingForCall ring(caller, layout, global_q_len, global_kv_len, local_impl, timeout_s, a.modes, in, device, refused);
    g = ring.run([&](CallRing& r) {
      return r.impl->backward(in, params, r.pos, grad_out, forward, f32_gradients, into ? &*into : nullptr, grad_lse);
    });
  }
  return gradients_result(g, out, in, like, where);
}

}  // namespace

void bind_ring(nb::module_& m) {
  m.def("ring_attention", &ring_attention, "q"_a, "k"_a, "v"_a, "comm"_a, "layout"_a, "global_q_len"_a.none(),
        "global_kv_len"_a.none(), "local_impl"_a, "timeout"_a, "deterministic"_a, "grad_wire"_a, "options"_a, "return_lse"_a, "out"_a.none(), "stream"_a,
        "like"_a);
  m.def("ring_attention_backward", &ring_attention_backward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "do"_a,
        "dlse"_a.none(), "comm"_a,
        "layout"_a, "global_q_len"_a.none(), "global_kv_len"_a.none(), "local_impl"_a, "timeout"_a, "deterministic"_a,
        "grad_wire"_a, "options"_a, "f32_gradients"_a, "out"_a.none(), "stream"_a, "like"_a);
  // A rank whose ring call the Python layer refused (`reason`) joins the call's first agreement with it, so
  // that every rank stops at once (call_ring.h).
  m.def("refuse_ring_call", [](nb::handle comm, double timeout, const std::string& reason) {
    const CallerComm caller = caller_comm_of(comm);
    nb::gil_scoped_release released;
    refuse_ring_call(caller, timeout, std::make_exception_ptr(std::runtime_error(reason)));
  }, "comm"_a, "timeout"_a, "reason"_a);
  // What the process's last ring call did (call_ring.h), as a dict; None before the first.
  m.def("ring_stats", []() -> nb::object {
    const std::optional<RingStats> s = last_ring_stats();
    if (!s) return nb::none();
    nb::dict d;
    d["steps"] = s->steps;
    d["skipped"] = s->skipped;
    d["transport"] = s->transport;
    d["compute_seconds"] = s->compute_seconds;
    d["wait_seconds"] = s->wait_seconds;
    return d;
  });
  // The rings kept between calls over MPI (call_ring.h): how many, and their collective release.
  m.def("kept_ring_count", &kept_ring_count);
  m.def("release_rings", [] {
    nb::gil_scoped_release released;
    release_kept_rings();
  });
  // Which rows of a global sequence of `length` part `index` of `parts` holds under `layout`.
  m.def("layout_indices", [](const std::string& layout, int64_t length, int parts, int index) {
    std::vector<int64_t> rows = layout_indices(parse_layout(layout), length, parts, index);
    Tensor t(DType::kI32, {int64_t(rows.size())});  // int32: sequence positions
    for (size_t i = 0; i < rows.size(); ++i) t.data<int32_t>()[i] = int32_t(rows[i]);
    return to_array(std::move(t), Framework::kNumpy);
  }, "layout"_a, "length"_a, "parts"_a, "index"_a);
}

}  // namespace ra::python
