// ringattn._core's ring: sequence-parallel attention over the ranks of an mpi4py communicator, each rank
// passing its shard (the layout's rows of the global sequence): the host ring for host arrays, the GPU
// ring for CUDA arrays (copy engines between ranks of one node, NCCL otherwise).
#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "arrays.h"
#include "call_options.h"
#include "attention/registry.h"
#include "attention/ring/ring.h"
#include "collectives/mpi_communicator.h"
#include "python_communicator.h"
#include "mesh/sequence_layout.h"
#include "runtime/error.h"

#if RA_HAVE_CUDA
#include "collectives/nccl_communicator.h"
#include "collectives/peer_copy_ring.h"
#endif

namespace ra::python {
namespace {

using namespace nb::literals;

// The ring for one call: the caller's communicator (duplicated: ringattn's messages never mix with the
// caller's), the layout and the global lengths (summed over the ranks where not given).
// The caller's communicator, read with the interpreter held: the MPI communicator behind an mpi4py one,
// or a Python object that carries the messages itself (python_communicator.h).
struct CallerComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  nb::handle python;
};

CallerComm caller_comm_of(nb::handle comm) {
  if (is_python_communicator(comm)) return {MPI_COMM_NULL, comm};
  RA_CHECK(nb::hasattr(comm, "py2f"), "comm is a ", nb::cast<std::string>(nb::handle(comm.type()).attr("__name__")),
           ", expected an mpi4py communicator (mpi4py.MPI.Comm) or an object with ring_shift (see ringattn.torch)");
  int initialized = 0;
  MPI_Initialized(&initialized);
  RA_CHECK(initialized, "MPI is not initialized: import mpi4py.MPI first");
  return {MPI_Comm_f2c(nb::cast<int>(comm.attr("py2f")())), nb::handle()};
}

// The GPU ring's communicators over the caller's MPI ranks: MPI itself where copy engines can carry
// every block (the same node, peer access), otherwise an NCCL communicator bootstrapped over MPI.
void use_device_ring(std::unique_ptr<Communicator>& communicator, RingContext& ctx,
                     std::unique_ptr<Communicator>& nccl) {
#if RA_HAVE_CUDA
  auto* mpi = dynamic_cast<MpiCommunicator*>(communicator.get());
  RA_CHECK(mpi != nullptr, "ring_attention on CUDA arrays needs comm to be an mpi4py communicator (launch with "
           "mpirun); a torch.distributed group carries host tensors only in this version");
  ctx.host_comm = mpi;
  if (!PeerCopyRing::supported(*mpi)) nccl = std::make_unique<NcclCommunicator>(*mpi);
#else
  RA_FAIL("ring_attention on CUDA arrays: this build of ringattn has no CUDA back end");
#endif
}

struct CallRing {
  CallRing(const CallerComm& comm, const std::string& layout, std::optional<int64_t> global_q_len,
           std::optional<int64_t> global_kv_len, const std::string& local_impl, double timeout_s,
           const AttentionInputs& in, const CallDevice& device) {
    RA_CHECK(timeout_s > 0, "timeout is ", timeout_s, " s, expected a positive number of seconds");
    if (comm.python.is_valid()) {
      communicator = std::make_unique<PythonCommunicator>(comm.python);
    } else {
      communicator = std::make_unique<MpiCommunicator>(comm.mpi);
    }
    ctx.comm = communicator.get();
    if (device.where.on_device()) {
      use_device_ring(communicator, ctx, nccl);
      if (nccl) ctx.comm = nccl.get();
    }
    int64_t lengths[2] = {in.q.dim(1), in.k.dim(1)};
    if (!global_q_len || !global_kv_len) communicator->all_reduce(lengths, 2, ReduceOp::kSum);
    ctx.layout = parse_layout(layout);
    ctx.global_q_len = global_q_len.value_or(lengths[0]);
    ctx.global_kv_len = global_kv_len.value_or(lengths[1]);
    ctx.local_impl = local_impl;
    ctx.step_timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
    impl = AttentionRegistry::builtin().create("ring", device.backend(), &ctx);
    device.bind(*impl);
    pos = ring_positions(ctx);
    // Checked here, before any exchange, in the caller's terms.
    for (auto [t, name, rows, global] : {std::tuple{&in.q, "q", pos.q.size(), ctx.global_q_len},
                                         std::tuple{&in.k, "k", pos.k.size(), ctx.global_kv_len}})
      RA_CHECK(t->dim(1) == int64_t(rows), name, " has ", t->dim(1), " rows (dimension 1) on rank ", communicator->rank(),
               ", but the ", layout, " layout of a global length ", global, " over ", communicator->size(), " ranks gives it ",
               rows, " (ringattn.shard cuts them)");
  }
  std::unique_ptr<Communicator> communicator, nccl;  // nccl: the GPU ring's, where copy engines cannot run
  RingContext ctx;
  std::unique_ptr<AttentionImpl> impl;
  TokenPositions pos;
};

nb::object ring_attention(const AnyArray& q, const AnyArray& k, const AnyArray& v, nb::handle comm,
                          const std::string& layout, std::optional<int64_t> global_q_len,
                          std::optional<int64_t> global_kv_len, const std::string& local_impl, double timeout_s,
                          const nb::dict& options, bool return_lse, nb::handle out, uintptr_t stream,
                          nb::handle like) {
  const CallOptions call = options_from(options);
  const Placement where = placement_of(q, "q");
  const AttentionInputs in = inputs_of(q, k, v, call, where);
  const AttentionParams params = params_of(call);
  const std::vector<TensorView> into = output_views(out, {{"o", 4}, {"lse", 3}}, where);
  const CallerComm caller = caller_comm_of(comm);
  AttentionOutput result;
  {
    nb::gil_scoped_release released;  // the ring waits on its peers without holding the interpreter
    const CallDevice device(where, stream);
    CallRing ring(caller, layout, global_q_len, global_kv_len, local_impl, timeout_s, in, device);
    if (into.empty()) {
      result = ring.impl->forward(in, params, ring.pos);
    } else {
      ring.impl->forward_into(in, params, ring.pos, ForwardViews{into[0], into[1]});
    }
  }
  if (!into.empty()) return given_output(out, return_lse);
  return output_of(result, return_lse, framework_of(like), where);
}

nb::object ring_attention_backward(const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& o,
                                   const AnyArray& lse, const AnyArray& d_o, nb::handle comm,
                                   const std::string& layout, std::optional<int64_t> global_q_len,
                                   std::optional<int64_t> global_kv_len, const std::string& local_impl,
                                   double timeout_s, const nb::dict& options, bool f32_gradients, nb::handle out,
                                   uintptr_t stream, nb::handle like) {
  const CallOptions call = options_from(options);
  const Placement where = placement_of(q, "q");
  const AttentionInputs in = inputs_of(q, k, v, call, where);
  const AttentionParams params = params_of(call);
  const ForwardViews forward = forward_views_of(o, lse, where);
  const TensorView grad_out = view_of(d_o, "do", 4, where);
  const std::vector<TensorView> into = output_views(out, {{"dq", 4}, {"dk", 4}, {"dv", 4}}, where);
  const GradViews into_views = into.empty() ? GradViews{} : GradViews{into[0], into[1], into[2], TensorView()};
  const CallerComm caller = caller_comm_of(comm);
  Gradients g;
  {
    nb::gil_scoped_release released;
    const CallDevice device(where, stream);
    CallRing ring(caller, layout, global_q_len, global_kv_len, local_impl, timeout_s, in, device);
    g = ring.impl->backward(in, params, ring.pos, grad_out, forward, f32_gradients,
                            into.empty() ? nullptr : &into_views);
  }
  if (!into.empty()) return given_gradients(out, g, in, framework_of(like), where);
  return gradient_tuple(g, in, framework_of(like), where);
}

}  // namespace

void bind_ring(nb::module_& m) {
  m.def("ring_attention", &ring_attention, "q"_a, "k"_a, "v"_a, "comm"_a, "layout"_a, "global_q_len"_a.none(),
        "global_kv_len"_a.none(), "local_impl"_a, "timeout"_a, "options"_a, "return_lse"_a, "out"_a.none(), "stream"_a,
        "like"_a);
  m.def("ring_attention_backward", &ring_attention_backward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "do"_a, "comm"_a,
        "layout"_a, "global_q_len"_a.none(), "global_kv_len"_a.none(), "local_impl"_a, "timeout"_a, "options"_a,
        "f32_gradients"_a, "out"_a.none(), "stream"_a, "like"_a);
  // Which rows of a global sequence of `length` part `index` of `parts` holds under `layout`.
  m.def("layout_indices", [](const std::string& layout, int64_t length, int parts, int index) {
    std::vector<int64_t> rows = layout_indices(parse_layout(layout), length, parts, index);
    Tensor t(DType::kI32, {int64_t(rows.size())});  // int32: sequence positions
    for (size_t i = 0; i < rows.size(); ++i) t.data<int32_t>()[i] = int32_t(rows[i]);
    return to_array(std::move(t), Framework::kNumpy);
  }, "layout"_a, "length"_a, "parts"_a, "index"_a);
}

}  // namespace ra::python
