// ringattn._core: attention and its backward on one process's arrays through the implementation
// registry, framework-neutral (DLPack in, the caller's framework out), on the host or on the CUDA device
// q lives on. Shapes are PyTorch's and the seeds': q (B, T, Hq, D), k (B, S, Hkv, D), v (B, S, Hkv, Dv);
// o (B, T, Hq, Dv); lse (B, Hq, T).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "arrays.h"
#include "call_f64.h"
#include "call_options.h"
#include "nccl_comm.h"
#include "attention/attention_impl.h"
#include "attention/misread_format.h"
#include "attention/registry.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra::python {
namespace {

// The implementations calls made, one per (name, backend, device) and thread (an implementation takes one
// caller at a time; PyTorch runs backwards on threads of its own). Never destroyed by the exit of a thread
// or of the process, where CUDA and cuDNN may already be torn down beside them (a crash at interpreter
// exit): release_impls(), which the package runs at interpreter exit, destroys them while all is up.
using ImplsByCaller = std::map<std::tuple<std::string, Backend, int, std::thread::id>, std::unique_ptr<AttentionImpl>>;
struct KeptImpls {
  std::mutex mutex;
  ImplsByCaller impls;
};
KeptImpls& kept_impls() {
  static KeptImpls* kept = new KeptImpls;  // never destroyed: release_impls() empties it
  return *kept;
}

void release_impls() {
  KeptImpls& kept = kept_impls();
  ImplsByCaller gone;
  {
    std::lock_guard<std::mutex> lock(kept.mutex);
    gone.swap(kept.impls);
  }
  nb::gil_scoped_release released;  // destructors may wait for a device
  gone.clear();
  release_side_streams();
}

// The implementation `impl` for where q lives, bound to the call's stream on a device: one object per
// (name, backend, device) and thread, reused across calls as a C++ caller would, so that what it keeps
// between calls (the positions' device and pinned buffers, cudnn's built graphs) is made once rather than
// allocated and freed by every call (a pinned or device free waits for the whole device).
AttentionImpl& impl_for(const std::string& impl, const CallDevice& call) {
  KeptImpls& kept = kept_impls();
  std::unique_ptr<AttentionImpl>* slot;
  {
    std::lock_guard<std::mutex> lock(kept.mutex);
    slot = &kept.impls[{impl, call.backend(), call.where.device, std::this_thread::get_id()}];
  }
  if (!*slot) {
    RA_CHECK(!call.captured(), "implementation '", impl, "' has not run on this thread and device before: the CUDA "
             "graph being captured cannot hold its set-up; run the call once before the capture (a warm-up)");
    *slot = AttentionRegistry::builtin().create(impl, call.backend());
  }
  call.bind(**slot);
  return **slot;
}

nb::object attention(const AnyArray& q, const AnyArray& k, const AnyArray& v, const std::string& impl,
                     const CallOptions& options, bool return_lse, nb::handle out, uintptr_t stream, nb::handle like) {
  const Placement where = placement_of(q, "q");
  const AttentionInputs in = inputs_of(q, k, v, options, where);
  const AttentionParams params = params_of(options);
  const std::optional<ForwardViews> into = forward_out_of(out, where);
  if (in.q.dtype() == DType::kF64) return attention_f64(in, params, impl, return_lse, into, out, like, where);
  check_capturable(where, stream, in, params, /*backward=*/false, nullptr, /*ring=*/false);
  const TokenPositions pos = TokenPositions::dense(in.q.dim(1), in.k.dim(1));
  AttentionOutput result;
  {
    nb::gil_scoped_release released;  // the kernels' threads run without the interpreter
    const CallDevice call(where, stream);
    if (into) {
      impl_for(impl, call).forward_into(in, params, pos, *into);
    } else {
      result = impl_for(impl, call).forward(in, params, pos);
    }
  }
  return forward_result(result, out, return_lse, like, where);
}

nb::object attention_backward(const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& o,
                              const AnyArray& lse, const AnyArray& d_o, const std::optional<AnyArray>& d_lse,
                              const std::string& impl, const CallOptions& options, bool f32_gradients, nb::handle out,
                              uintptr_t stream, nb::handle like) {
  const Placement where = placement_of(q, "q");
  const AttentionInputs in = inputs_of(q, k, v, options, where);
  const AttentionParams params = params_of(options);
  const ForwardViews forward = forward_views_of(o, lse, where);
  const TensorView grad_out = view_of(d_o, "do", 4, where);
  const TensorView grad_lse = optional_view_of(d_lse, "dlse", 3, where);
  const std::optional<GradViews> into = gradients_out_of(out, in, where);
  if (in.q.dtype() == DType::kF64)
    return attention_backward_f64(in, params, impl, forward, grad_out, grad_lse, f32_gradients, into, out, like, where);
  check_capturable(where, stream, in, params, /*backward=*/true, into ? &*into : nullptr, /*ring=*/false);
  Gradients g;
  {
    nb::gil_scoped_release released;
    const CallDevice call(where, stream);
    AttentionImpl& kernel = impl_for(impl, call);
    RA_CHECK(kernel.has_backward(), "implementation '", impl, "' has no backward pass");
    g = kernel.backward(in, params, TokenPositions::dense(in.q.dim(1), in.k.dim(1)), grad_out, forward, f32_gradients,
                        into ? &*into : nullptr, grad_lse);
  }
  return gradients_result(g, out, in, like, where);
}

}  // namespace
}  // namespace ra::python

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  using namespace nb::literals;
  using ra::python::AnyArray;
  // ringattn's errors name the tensor, the dimension and what was expected: ValueError, as for any bad argument.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ra::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.message().c_str());
    }
  });
  // The keyword options come as one dict (the Python wrappers in ringattn/__init__.py hold the signatures).
  // `stream`: the cudaStream_t (as an integer; 0 = the legacy default stream) device work goes on.
  // `out`: None, or the caller's arrays the results are written into ((o, lse); (dq, dk, dv)).
  m.def("attention",
        [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const std::string& impl, const nb::dict& options,
           bool return_lse, nb::handle out, uintptr_t stream, nb::handle like) {
          return ra::python::attention(q, k, v, impl, ra::python::options_from(options), return_lse, out, stream, like);
        },
        "q"_a, "k"_a, "v"_a, "impl"_a, "options"_a, "return_lse"_a, "out"_a.none(), "stream"_a, "like"_a);
  m.def("attention_backward",
        [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& o, const AnyArray& lse,
           const AnyArray& d_o, const std::optional<AnyArray>& d_lse, const std::string& impl, const nb::dict& options,
           bool f32_gradients, nb::handle out, uintptr_t stream, nb::handle like) {
          return ra::python::attention_backward(q, k, v, o, lse, d_o, d_lse, impl, ra::python::options_from(options),
                                                f32_gradients, out, stream, like);
        },
        "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "do"_a, "dlse"_a.none(), "impl"_a, "options"_a, "f32_gradients"_a,
        "out"_a.none(), "stream"_a, "like"_a);
  m.def("release_impls", &ra::python::release_impls,
        "Destroys the implementations calls kept (their streams, buffers, cuDNN graphs); the package runs it at "
        "interpreter exit, while CUDA is still up.");
  m.def("built_with_cuda", &ra::built_with_cuda, "Whether this build of ringattn has its CUDA back end.");
  m.def("likely_misread_format", [](int64_t batch, int64_t q_len, int64_t q_heads, int64_t kv_len) -> std::string {
    switch (ra::likely_misread_format(batch, q_len, q_heads, kv_len)) {
      case ra::MisreadFormat::kBHSD: return "bhsd";
      case ra::MisreadFormat::kSBHD: return "sbhd";
      case ra::MisreadFormat::kNone: break;
    }
    return "";
  }, "batch"_a, "q_len"_a, "q_heads"_a, "kv_len"_a,
        "The format a q / k pair read as bshd most likely holds ('bhsd', 'sbhd'), or '' (the CLI's rule too).");
  m.def("cuda_cache_bytes", &ra::device_cache_bytes,
        "Device bytes ringattn's cache of call temporaries holds for reuse, over this process's GPUs.");
  m.def("empty_cuda_cache", &ra::release_device_cache,
        "Waits for the GPUs, then gives ringattn's cached device memory back to the driver (for PyTorch's allocator).");
  m.def("set_cuda_cache_limit", &ra::set_device_cache_limit, "bytes"_a,
        "The most device bytes ringattn's cache keeps per GPU once it has waited for the device (default: no bound).");
  ra::python::bind_ring(m);
  ra::python::bind_nccl_comm(m);
}
