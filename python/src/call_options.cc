#include "call_options.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <string>

#include "runtime/error.h"
#include "runtime/graph_capture.h"
#include "runtime/memory.h"

namespace ra::python {

namespace {

// What an option takes, for the refusal of a value of another type.
const char* option_type_text(const std::string& name) {
  if (name == "window") return "a (left, right) pair of ints";
  if (name == "causal" || name == "deterministic") return "a bool";
  if (name == "flash_kernel") return "a str";
  if (name == "dropout_seed" || name == "mask_identity") return "an integer in [0, 2^64)";
  if (name == "batch_offset" || name == "head_offset") return "an integer";
  return "a number";
}

}  // namespace

CallOptions options_from(const nb::dict& options) {
  CallOptions o;
  for (auto [key, value] : options) {
    const std::string name = nb::cast<std::string>(key);
    auto array = [&]() -> OptionalArray {
      if (value.is_none()) return std::nullopt;
      try {
        return nb::cast<AnyArray>(value);
      } catch (const nb::cast_error&) {
        RA_FAIL(name, " is a ", nb::cast<std::string>(nb::handle(value.type()).attr("__name__")),
                ", expected an array (numpy, or anything with __dlpack__)");
      }
    };
    try {
      if (name == "causal") o.causal = nb::cast<bool>(value);
      else if (name == "window") o.window = nb::cast<std::optional<std::pair<int64_t, int64_t>>>(value);
      else if (name == "softcap") o.softcap = nb::cast<float>(value);
      else if (name == "scale") o.scale = nb::cast<float>(value);
      else if (name == "dropout") o.dropout = nb::cast<float>(value);
      else if (name == "dropout_seed") o.dropout_seed = nb::cast<uint64_t>(value);
      else if (name == "batch_offset") o.batch_offset = nb::cast<int64_t>(value);
      else if (name == "head_offset") o.head_offset = nb::cast<int64_t>(value);
      else if (name == "flash_kernel") o.flash_kernel = parse_flash_kernel(nb::cast<std::string>(value), "flash_kernel");
      else if (name == "deterministic") o.deterministic = nb::cast<bool>(value);
      else if (name == "sinks") o.sinks = array();
      else if (name == "bias") o.bias = array();
      else if (name == "mask") o.mask = array();
      else if (name == "mask_identity") o.mask_identity = nb::cast<uint64_t>(value);
      else if (name == "segment_ids") o.segment_ids = array();
      else if (name == "kv_segment_ids") o.kv_segment_ids = array();
      else RA_FAIL("unknown option '", name, "' (known: causal, window, softcap, scale, dropout, dropout_seed, "
                   "batch_offset, head_offset, flash_kernel, deterministic, sinks, bias, mask, mask_identity, segment_ids, "
                   "kv_segment_ids)");
    } catch (const nb::cast_error&) {
      std::string shown = nb::cast<std::string>(nb::repr(value));
      if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
      RA_FAIL("option ", name, " is ", shown, " of type ",
              nb::cast<std::string>(nb::handle(value.type()).attr("__name__")), ": expected ", option_type_text(name));
    }
  }
  // As the CLI's --dropout-seed: a seed without dropout would change nothing (dropout=0.0 given is taken).
  RA_CHECK(options.contains("dropout") || !options.contains("dropout_seed"), "dropout_seed ", o.dropout_seed,
           " without dropout: no pair is dropped, so the seed would change nothing (pass dropout=p too)");
  return o;
}

AttentionParams params_of(const CallOptions& o) {
  RA_CHECK(o.dropout >= 0 && o.dropout < 1, "dropout is ", o.dropout, ", expected a probability in [0, 1)");
  RA_CHECK(o.softcap >= 0, "softcap is ", o.softcap, ", expected 0 (off) or a positive cap");
  RA_CHECK(o.batch_offset >= 0 && o.head_offset >= 0, "batch_offset ", o.batch_offset, " and head_offset ", o.head_offset,
           ": expected the global index (>= 0) of this call's first batch entry and query head");
  AttentionParams p;
  p.causal = o.causal;
  if (o.window) p.window_left = o.window->first, p.window_right = o.window->second;
  p.logits_soft_cap = o.softcap;
  p.softmax_scale = o.scale;
  p.dropout_prob = o.dropout;
  p.dropout_seed = o.dropout_seed;
  p.batch_offset = o.batch_offset;
  p.head_offset = o.head_offset;
  p.flash_kernel = o.flash_kernel;
  p.deterministic = o.deterministic;
  return p;
}

AttentionInputs inputs_of(const AnyArray& q, const AnyArray& k, const AnyArray& v, const CallOptions& o,
                          const Placement& where) {
  AttentionInputs in;
  in.q = view_of(q, "q", 4), in.k = view_of(k, "k", 4, where), in.v = view_of(v, "v", 4, where);
  if (o.sinks) in.sinks = view_of(*o.sinks, "sinks", 1, where);
  if (o.bias) in.bias = view_of(*o.bias, "bias", 4, where);
  if (o.mask) in.mask = view_of(*o.mask, "mask", 4, where);
  RA_CHECK(o.mask || o.mask_identity == 0, "mask_identity ", o.mask_identity, " names a mask, but the call has none");
  in.mask_identity = o.mask_identity;
  RA_CHECK(o.segment_ids || !o.kv_segment_ids, "kv_segment_ids without segment_ids (the queries' ids)");
  if (o.segment_ids) {
    in.q_segment_ids = view_of(*o.segment_ids, "segment_ids", 2, where);
    // The keys' ids default to the queries' (self-attention, T = S).
    RA_CHECK(o.kv_segment_ids || in.q.dim(1) == in.k.dim(1),
             "segment_ids (B, T) given without kv_segment_ids, but the keys are not the queries (T = ",
             in.q.dim(1), ", S = ", in.k.dim(1), "): pass kv_segment_ids (B, S) too");
    in.kv_segment_ids = o.kv_segment_ids ? view_of(*o.kv_segment_ids, "kv_segment_ids", 2, where) : in.q_segment_ids;
  }
  return in;
}

ForwardViews forward_views_of(const AnyArray& o, const AnyArray& lse, const Placement& where) {
  return {view_of(o, "o", 4, where), view_of(lse, "lse", 3, where)};
}

namespace {

// One entry of `out` as a view, checked for its rank and for living where q does.
TensorView output_view(nb::handle entry, const char* name, size_t rank, const Placement& where) {
  try {
    return view_of(nb::cast<AnyArray>(entry), name, int(rank), where);
  } catch (const nb::cast_error&) {
    RA_FAIL("out's ", name, " is a ", nb::cast<std::string>(nb::handle(entry.type()).attr("__name__")),
            ", expected an array (anything with __dlpack__)");
  }
}

// `out` as one view per entry of `names` (name, rank); empty when `out` is None.
std::vector<TensorView> output_views(nb::handle out, std::initializer_list<std::pair<const char*, size_t>> names,
                                     const Placement& where) {
  std::vector<TensorView> views;
  if (out.is_none()) return views;
  RA_CHECK(nb::isinstance<nb::sequence>(out) && nb::len(out) == names.size(), "out must be a sequence of ",
           names.size(), " arrays (", names.begin()->first, names.size() > 2 ? ", ..." : ", ", (names.end() - 1)->first,
           ")");
  size_t i = 0;
  for (const auto& [name, rank] : names) views.push_back(output_view(out[i++], name, rank, where));
  return views;
}

// How many entries a backward's `out` has past dq, dk, dv when it names the bias's and the sinks' gradients.
size_t parameter_entries(const AttentionInputs& in) { return size_t(in.bias.defined()) + size_t(in.sinks.defined()); }

bool names_parameter_gradients(nb::handle out, const AttentionInputs& in) {
  return !out.is_none() && parameter_entries(in) > 0 && nb::len(out) == 3 + parameter_entries(in);
}

}  // namespace

std::optional<ForwardViews> forward_out_of(nb::handle out, const Placement& where) {
  const std::vector<TensorView> v = output_views(out, {{"o", 4}, {"lse", 3}}, where);
  if (v.empty()) return std::nullopt;
  return ForwardViews{v[0], v[1]};
}

std::optional<GradViews> gradients_out_of(nb::handle out, const AttentionInputs& in, const Placement& where) {
  if (out.is_none()) return std::nullopt;
  const bool bias = in.bias.defined(), sinks = in.sinks.defined();
  const std::string full = std::string("(dq, dk, dv") + (bias ? ", dbias or None" : "") +
                           (sinks ? ", dsinks or None" : "") + ")";
  RA_CHECK(nb::isinstance<nb::sequence>(out) && (nb::len(out) == 3 || nb::len(out) == 3 + parameter_entries(in)),
           "out must be a sequence (dq, dk, dv)", bias || sinks ? " or " + full : std::string());
  GradViews views{output_view(out[0], "dq", 4, where), output_view(out[1], "dk", 4, where),
                  output_view(out[2], "dv", 4, where), TensorView()};
  if (!names_parameter_gradients(out, in)) return views;
  size_t i = 3;
  // None: that gradient is not formed at all (a parameter that takes none).
  if (bias) {
    const nb::handle entry = out[i++];
    views.bias_gradient = !entry.is_none();
    if (views.bias_gradient) views.dbias = output_view(entry, "dbias", size_t(in.bias.rank()), where);
  }
  if (sinks) {
    const nb::handle entry = out[i++];
    views.sinks_gradient = !entry.is_none();
    if (views.sinks_gradient) views.dsinks = output_view(entry, "dsinks", 1, where);
  }
  return views;
}

nb::object forward_result(AttentionOutput& result, nb::handle out, bool return_lse, nb::handle like,
                          const Placement& where) {
  const Framework framework = framework_of(like);
  nb::object o = out.is_none() ? to_array(std::move(result.o), framework, where.device) : nb::object(out[0]);
  if (!return_lse) return o;
  return nb::make_tuple(o, out.is_none() ? to_array(std::move(result.lse), framework, where.device) : nb::object(out[1]));
}

nb::object gradients_result(Gradients& g, nb::handle out, const AttentionInputs& in, nb::handle like,
                            const Placement& where) {
  const Framework framework = framework_of(like);
  nb::list result;
  Tensor* computed[3] = {&g.dq, &g.dk, &g.dv};
  for (size_t i = 0; i < 3; ++i)
    result.append(out.is_none() ? to_array(std::move(*computed[i]), framework, where.device) : nb::object(out[i]));
  // dbias / dsinks: the caller's array where out named it (None where it asked for none), else ours.
  const bool named = names_parameter_gradients(out, in);
  size_t i = 3;
  for (auto [given, gradient] : {std::pair{in.bias.defined(), &g.dbias}, std::pair{in.sinks.defined(), &g.dsinks}}) {
    if (!given) continue;
    result.append(named ? nb::object(out[i++]) : to_array(std::move(*gradient), framework, where.device));
  }
  return nb::tuple(result);
}

void check_capturable(const Placement& where, uintptr_t stream, const AttentionInputs& in, const AttentionParams& params,
                      bool backward, const GradViews* into, bool ring) {
  if (!where.on_device()) return;
  {
    const ScopedCudaDevice on(where.device);
    if (!cuda_stream_capturing(reinterpret_cast<void*>(stream))) return;
  }
  const char* tail = "; call it outside the capture (torch.cuda.graph, torch.compile(mode='reduce-overhead')), or "
                     "compile with mode='default'";
  RA_CHECK(!ring, "ring attention cannot be captured into a CUDA graph: every call exchanges K/V blocks with its "
           "peers and waits for them on the host", tail);
  RA_CHECK(params.dropout_prob == 0, "dropout (", params.dropout_prob, ") cannot be captured into a CUDA graph: every "
           "replay would draw the captured call's dropout mask again", tail);
  if (!backward) return;
  // A gradient returned in device memory of ringattn's own would outlive the graph's call.
  const char* given = "; pass out=(dq, dk, dv[, dbias][, dsinks]) arrays for it to be written into (None: not formed)";
  RA_CHECK(into != nullptr, "a backward's gradients cannot be captured into a CUDA graph when they are returned in "
           "device memory of ringattn's own", given);
  RA_CHECK(!bias_gradient_wanted(in, into) || into->dbias.defined(), "the gradient of bias cannot be captured into "
           "a CUDA graph when it is returned in device memory of ringattn's own", given);
  RA_CHECK(!sinks_gradient_wanted(in, into) || into->dsinks.defined(), "the gradient of sinks cannot be "
           "captured into a CUDA graph when it is returned in device memory of ringattn's own", given);
}

CallDevice::CallDevice(const Placement& where, uintptr_t stream) : where(where) {
  RA_CHECK(where.on_device() || stream == 0, "stream is given (", stream, ") but q is in host memory: a stream "
           "orders device work only");
  if (!where.on_device()) return;
  device.emplace(where.device);
  side.emplace(reinterpret_cast<void*>(stream));
}

void CallDevice::bind(AttentionImpl& impl) const {
  if (side) impl.set_cuda_stream(side->get());
}

}  // namespace ra::python
