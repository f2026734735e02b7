#include "call_f64.h"

#include <cstring>
#include <vector>

#include "attention/backward.h"
#include "attention/cpu/sdpa_cpu.h"
#include "attention/registry.h"
#include "attention/validate.h"
#include "runtime/error.h"

namespace ra::python {
namespace {

// The reference is the host sdpa's f64 template; the kernels, the GPU and the rings take f32, f16 and bf16.
void check_f64_call(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                    const std::string& impl, const Placement& where) {
  RA_CHECK(AttentionRegistry::builtin().canonical_name(impl) == "sdpa" && !where.on_device(), "q, k and v are f64: ",
           "only impl 'sdpa' on the host computes in f64 (the f64 reference); impl '", impl, "' on ", where.str(),
           " takes f32, f16 or bf16");
  RA_CHECK(params.flash_kernel == FlashKernel::kAuto, "flash_kernel ", flash_kernel_name(params.flash_kernel),
           " chooses CUDA flash_attn2 kernels, but f64 inputs run impl 'sdpa' on the host");
  validate_attention(in, params, pos, /*max_head_dim=*/256, /*f64=*/true);
}

// values (contiguous) into `dst`: a contiguous host view of as many f64 or f32 elements.
void store(const std::vector<double>& values, const TensorView& dst) {
  if (dst.dtype() == DType::kF64) {
    std::memcpy(dst.data_as<double>(), values.data(), values.size() * sizeof(double));
  } else {
    for (size_t i = 0; i < values.size(); ++i) dst.data_as<float>()[i] = float(values[i]);
  }
}

// values into a new tensor of `dtype` (f64, or f32 where asked for).
Tensor tensor_of(const std::vector<double>& values, const Shape& shape, DType dtype) {
  Tensor t(dtype, shape);
  store(values, t.view());
  return t;
}

// values into the caller's output `dst`, checked as every call checks its outputs (shape, q's f64 or f32,
// contiguous, in q's memory).
void write_into(const std::vector<double>& values, const TensorView& dst, const char* name, const Shape& shape,
                const TensorView& q) {
  check_output(dst, name, shape, q, /*q_dtype_or_f32=*/true);
  store(values, dst);
}

}  // namespace

nb::object attention_f64(const AttentionInputs& in, const AttentionParams& params, const std::string& impl,
                         bool return_lse, const std::optional<ForwardViews>& into, nb::handle out, nb::handle like,
                         const Placement& where) {
  const TokenPositions pos = TokenPositions::dense(in.q.dim(1), in.k.dim(1));
  check_f64_call(in, params, pos, impl, where);
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), Dv = in.v.dim(3);
  const Shape o_shape{B, T, Hq, Dv}, lse_shape{B, Hq, T};
  ReferenceOutput r;
  {
    nb::gil_scoped_release released;
    r = reference_attention_f64(in, params, pos);
  }
  if (into) {
    write_into(r.o, into->o, "o", o_shape, in.q);
    write_into(r.lse, into->lse, "lse", lse_shape, in.q);
  }
  AttentionOutput result;
  if (!into) result = {tensor_of(r.o, o_shape, DType::kF64), tensor_of(r.lse, lse_shape, DType::kF64)};
  return forward_result(result, out, return_lse, like, where);
}

nb::object attention_backward_f64(const AttentionInputs& in, const AttentionParams& params, const std::string& impl,
                                  const ForwardViews& forward, const TensorView& d_o, const TensorView& d_lse,
                                  bool f32_gradients,
                                  const std::optional<GradViews>& into, nb::handle out, nb::handle like,
                                  const Placement& where) {
  const TokenPositions pos = TokenPositions::dense(in.q.dim(1), in.k.dim(1));
  check_f64_call(in, params, pos, impl, where);
  // The reference recomputes its own f64 forward; o and lse are checked as the kernels' backward checks them.
  validate_backward(in, forward.o, BackwardInputs{forward.lse, d_o, TensorView(), forward.o, d_lse});
  ReferenceGradients r;
  {
    nb::gil_scoped_release released;
    r = reference_attention_backward_f64(in, params, pos, d_o, /*with_terms=*/false, d_lse);
  }
  if (into) {
    write_into(r.dq, into->dq, "dq", in.q.shape(), in.q);
    write_into(r.dk, into->dk, "dk", in.k.shape(), in.q);
    write_into(r.dv, into->dv, "dv", in.v.shape(), in.q);
  }
  const DType dtype = f32_gradients ? DType::kF32 : DType::kF64;
  Gradients g;
  if (!into) {
    g.dq = tensor_of(r.dq, in.q.shape(), dtype);
    g.dk = tensor_of(r.dk, in.k.shape(), dtype);
    g.dv = tensor_of(r.dv, in.v.shape(), dtype);
  }
  // dbias / dsinks: into the caller's arrays where out names them (None: not asked for), else returned.
  if (into && into->dbias.defined()) write_into(r.dbias, into->dbias, "dbias", in.bias.shape(), in.q);
  if (into && into->dsinks.defined()) write_into(r.dsinks, into->dsinks, "dsinks", in.sinks.shape(), in.q);
  const GradViews* asked = into ? &*into : nullptr;
  if (bias_gradient_wanted(in, asked) && !(into && into->dbias.defined()))
    g.dbias = tensor_of(r.dbias, in.bias.shape(), dtype);
  if (sinks_gradient_wanted(in, asked) && !(into && into->dsinks.defined()))
    g.dsinks = tensor_of(r.dsinks, in.sinks.shape(), dtype);
  return gradients_result(g, out, in, like, where);
}

}  // namespace ra::python
