// Arrays across the Python boundary: any DLPack array (numpy, PyTorch, JAX, CuPy) in as a TensorView
// without a copy, and ringattn's results out as arrays of the caller's framework owning their memory.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "runtime/tensor.h"

namespace ra::python {

namespace nb = nanobind;
using AnyArray = nb::ndarray<nb::ro>;

// `array` (host memory for now) viewed as a TensorView; `name` and `expected_rank` make the error.
TensorView view_of(const AnyArray& array, const char* name, size_t expected_rank);

// Which framework the results go back to: the one `like` came from (numpy unless it is a PyTorch or JAX array).
enum class Framework { kNumpy, kTorch, kJax };
Framework framework_of(nb::handle like);

// `t` moved into an array of `framework`, which owns it from here on.
nb::object to_array(Tensor t, Framework framework);

}  // namespace ra::python
