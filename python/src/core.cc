// ringattn._core: attention and its backward on one process's arrays through the implementation
// registry, framework-neutral (DLPack in, the caller's framework out). Shapes are PyTorch's and the
// seeds': q (B, T, Hq, D), k (B, S, Hkv, D), v (B, S, Hkv, Dv); o (B, T, Hq, Dv); lse (B, Hq, T).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <utility>

#include "arrays.h"
#include "call_options.h"
#include "attention/attention_impl.h"
#include "attention/registry.h"
#include "runtime/error.h"

namespace ra::python {
namespace {

std::unique_ptr<AttentionImpl> host_impl(const std::string& impl) {
  return AttentionRegistry::builtin().create(impl, Backend::kCpu);
}

nb::object attention(const AnyArray& q, const AnyArray& k, const AnyArray& v, const std::string& impl,
                     const CallOptions& options, bool return_lse, nb::handle like) {
  const AttentionInputs in = inputs_of(q, k, v, options);
  const AttentionParams params = params_of(options);
  AttentionOutput out;
  {
    nb::gil_scoped_release released;  // the kernels' threads run without the interpreter
    out = host_impl(impl)->forward(in, params);
  }
  return output_of(out, return_lse, framework_of(like));
}

nb::object attention_backward(const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& o,
                              const AnyArray& lse, const AnyArray& d_o, const std::string& impl,
                              const CallOptions& options, bool f32_gradients, nb::handle like) {
  const AttentionInputs in = inputs_of(q, k, v, options);
  const AttentionParams params = params_of(options);
  const AttentionOutput forward = forward_output_of(o, lse);
  const TensorView grad_out = view_of(d_o, "do", 4);
  Gradients g;
  {
    nb::gil_scoped_release released;
    const std::unique_ptr<AttentionImpl> kernel = host_impl(impl);
    RA_CHECK(kernel->has_backward(), "implementation '", impl, "' has no backward pass");
    g = kernel->backward(in, params, grad_out, &forward, f32_gradients);
  }
  return gradient_tuple(g, in, framework_of(like));
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
  m.def("attention",
        [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const std::string& impl, const nb::dict& options,
           bool return_lse, nb::handle like) {
          return ra::python::attention(q, k, v, impl, ra::python::options_from(options), return_lse, like);
        },
        "q"_a, "k"_a, "v"_a, "impl"_a, "options"_a, "return_lse"_a, "like"_a);
  m.def("attention_backward",
        [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& o, const AnyArray& lse,
           const AnyArray& d_o, const std::string& impl, const nb::dict& options, bool f32_gradients, nb::handle like) {
          return ra::python::attention_backward(q, k, v, o, lse, d_o, impl, ra::python::options_from(options),
                                                f32_gradients, like);
        },
        "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "do"_a, "impl"_a, "options"_a, "f32_gradients"_a, "like"_a);
  ra::python::bind_ring(m);
}
