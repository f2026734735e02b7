// f64 arrays through the f64 reference (the host sdpa's f64 template: inputs, arithmetic and results in
// f64), forward and backward: what finite-difference checks such as torch.autograd.gradcheck need. The
// kernels, the GPU and the rings take f32, f16 and bf16; an f64 call names 'sdpa' on the host or is refused.
#pragma once

#include <optional>
#include <string>

#include "call_options.h"

namespace ra::python {

// As core.cc's attention (o, or (o, lse) with return_lse; o and lse in f64, or into the caller's `into`).
nb::object attention_f64(const AttentionInputs& in, const AttentionParams& params, const std::string& impl,
                         bool return_lse, const std::optional<ForwardViews>& into, nb::handle out, nb::handle like,
                         const Placement& where);

// As core.cc's attention_backward (dq, dk, dv[, dbias][, dsinks] in f64, f32 with f32_gradients). The
// reference recomputes its forward: o and lse are checked, not read.
nb::object attention_backward_f64(const AttentionInputs& in, const AttentionParams& params, const std::string& impl,
                                  const ForwardViews& forward, const TensorView& d_o, const TensorView& d_lse,
                                  bool f32_gradients,
                                  const std::optional<GradViews>& into, nb::handle out, nb::handle like,
                                  const Placement& where);

}  // namespace ra::python
