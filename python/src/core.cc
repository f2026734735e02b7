// ringattn._core: attention and its backward on one process's arrays through the implementation
// registry, framework-neutral (DLPack in, the caller's framework out). Shapes are PyTorch's and the
// seeds': q (B, T, Hq, D), k (B, S, Hkv, D), v (B, S, Hkv, Dv); o (B, T, Hq, Dv); lse (B, Hq, T).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <utility>

#include "arrays.h"
#include "attention/attention_impl.h"
#include "attention/registry.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra::python {
namespace {

using namespace nb::literals;
using OptionalArray = std::optional<AnyArray>;

// The options every call takes, by the seeds' names.
struct CallOptions {
  bool causal = false;
  std::optional<std::pair<int64_t, int64_t>> window;  // (left, right); -1: unbounded on that side
  float softcap = 0, scale = 0, dropout = 0;
  uint64_t dropout_seed = 0;
  OptionalArray sinks, bias, mask, segment_ids, kv_segment_ids;
};

AttentionParams params_of(const CallOptions& o) {
  RA_CHECK(o.dropout >= 0 && o.dropout < 1, "dropout is ", o.dropout, ", expected a probability in [0, 1)");
  RA_CHECK(o.softcap >= 0, "softcap is ", o.softcap, ", expected 0 (off) or a positive cap");
  AttentionParams p;
  p.causal = o.causal;
  if (o.window) p.window_left = o.window->first, p.window_right = o.window->second;
  p.logits_soft_cap = o.softcap;
  p.softmax_scale = o.scale;
  p.dropout_prob = o.dropout;
  p.dropout_seed = o.dropout_seed;
  return p;
}

AttentionInputs inputs_of(const AnyArray& q, const AnyArray& k, const AnyArray& v, const CallOptions& o) {
  AttentionInputs in;
  in.q = view_of(q, "q", 4), in.k = view_of(k, "k", 4), in.v = view_of(v, "v", 4);
  if (o.sinks) in.sinks = view_of(*o.sinks, "sinks", 1);
  if (o.bias) in.bias = view_of(*o.bias, "bias", 4);
  if (o.mask) in.mask = view_of(*o.mask, "mask", 4);
  RA_CHECK(o.segment_ids || !o.kv_segment_ids, "kv_segment_ids without segment_ids (the queries' ids)");
  if (o.segment_ids) {
    in.q_segment_ids = view_of(*o.segment_ids, "segment_ids", 2);
    // The keys' ids default to the queries' (self-attention, T = S).
    in.kv_segment_ids = o.kv_segment_ids ? view_of(*o.kv_segment_ids, "kv_segment_ids", 2) : in.q_segment_ids;
  }
  return in;
}

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
  const Framework framework = framework_of(like);
  nb::object o = to_array(std::move(out.o), framework);
  if (!return_lse) return o;
  return nb::make_tuple(o, to_array(std::move(out.lse), framework));
}

nb::object attention_backward(const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& o,
                              const AnyArray& lse, const AnyArray& d_o, const std::string& impl,
                              const CallOptions& options, bool f32_gradients, nb::handle like) {
  const AttentionInputs in = inputs_of(q, k, v, options);
  const AttentionParams params = params_of(options);
  // The forward's O and LSE as the backward's contract holds them (owned tensors): one copy each.
  const AttentionOutput forward{to_memory(view_of(o, "o", 4), MemoryKind::kHost),
                                to_memory(view_of(lse, "lse", 3), MemoryKind::kHost)};
  const TensorView grad_out = view_of(d_o, "do", 4);
  Gradients g;
  {
    nb::gil_scoped_release released;
    const std::unique_ptr<AttentionImpl> kernel = host_impl(impl);
    RA_CHECK(kernel->has_backward(), "implementation '", impl, "' has no backward pass");
    g = kernel->backward(in, params, grad_out, &forward, f32_gradients);
  }
  const Framework framework = framework_of(like);
  nb::list result;
  for (Tensor* t : {&g.dq, &g.dk, &g.dv}) result.append(to_array(std::move(*t), framework));
  if (in.bias.defined()) result.append(to_array(std::move(g.dbias), framework));
  if (in.sinks.defined()) result.append(to_array(std::move(g.dsinks), framework));
  return nb::tuple(result);
}

}  // namespace
}  // namespace ra::python

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  using namespace nb::literals;
  using ra::python::AnyArray;
  using ra::python::CallOptions;
  using ra::python::OptionalArray;
  // ringattn's errors name the tensor, the dimension and what was expected: ValueError, as for any bad argument.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ra::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.message().c_str());
    }
  });
  m.def(
      "attention",
      [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const std::string& impl, bool causal,
         std::optional<std::pair<int64_t, int64_t>> window, float softcap, float scale, OptionalArray sinks,
         OptionalArray bias, OptionalArray mask, OptionalArray segment_ids, OptionalArray kv_segment_ids,
         float dropout, uint64_t dropout_seed, bool return_lse, nb::handle q_object) {
        return ra::python::attention(q, k, v, impl,
                                     CallOptions{causal, window, softcap, scale, dropout, dropout_seed, sinks, bias,
                                                 mask, segment_ids, kv_segment_ids},
                                     return_lse, q_object);
      },
      "q"_a, "k"_a, "v"_a, nb::kw_only(), "impl"_a = "flash_attn2", "causal"_a = false, "window"_a = nb::none(),
      "softcap"_a = 0.0f, "scale"_a = 0.0f, "sinks"_a = nb::none(), "bias"_a = nb::none(), "mask"_a = nb::none(),
      "segment_ids"_a = nb::none(), "kv_segment_ids"_a = nb::none(), "dropout"_a = 0.0f, "dropout_seed"_a = 0,
      "return_lse"_a = false, "like"_a = nb::none(),
      "Attention of q (B, T, Hq, D) over k (B, S, Hkv, D) and v (B, S, Hkv, Dv) on one process; returns o\n"
      "(B, T, Hq, Dv) in q's dtype, and with return_lse=True also lse (B, Hq, T) float32 (natural log).\n"
      "Options as the seeds name them: causal (queries aligned to the end of the keys), window=(left, right),\n"
      "softcap, scale (0: 1/sqrt(D)), sinks (Hq,) float32, bias (B|1, Hq|1, T|1, S) float32, mask (same\n"
      "shape, bool / uint8, true = attend), segment_ids (B, T) int32 (kv_segment_ids (B, S) when S != T),\n"
      "dropout with dropout_seed. Results come back as arrays of `like`'s framework (default: numpy).");
  m.def(
      "attention_backward",
      [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& o, const AnyArray& lse,
         const AnyArray& d_o, const std::string& impl, bool causal, std::optional<std::pair<int64_t, int64_t>> window,
         float softcap, float scale, OptionalArray sinks, OptionalArray bias, OptionalArray mask,
         OptionalArray segment_ids, OptionalArray kv_segment_ids, float dropout, uint64_t dropout_seed,
         bool f32_gradients, nb::handle like) {
        return ra::python::attention_backward(q, k, v, o, lse, d_o, impl,
                                              CallOptions{causal, window, softcap, scale, dropout, dropout_seed, sinks,
                                                          bias, mask, segment_ids, kv_segment_ids},
                                              f32_gradients, like);
      },
      "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "do"_a, nb::kw_only(), "impl"_a = "flash_attn2", "causal"_a = false,
      "window"_a = nb::none(), "softcap"_a = 0.0f, "scale"_a = 0.0f, "sinks"_a = nb::none(), "bias"_a = nb::none(),
      "mask"_a = nb::none(), "segment_ids"_a = nb::none(), "kv_segment_ids"_a = nb::none(), "dropout"_a = 0.0f,
      "dropout_seed"_a = 0, "f32_gradients"_a = false, "like"_a = nb::none(),
      "The backward of attention(): given the forward's o and lse and do = dLoss/do (B, T, Hq, Dv), returns\n"
      "(dq, dk, dv) in q's dtype (float32 with f32_gradients=True), then dbias (the bias's shape) and dsinks\n"
      "(Hq,) float32 where a bias / sinks were given. The same options as the forward, which it must match.");
}
