// Arrays across the Python boundary: any DLPack array (numpy, PyTorch, JAX, CuPy) in as a TensorView
// without a copy, and ringattn's results out as arrays of the caller's framework owning their memory.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <string>

#include "runtime/tensor.h"

namespace ra::python {

namespace nb = nanobind;
using AnyArray = nb::ndarray<nb::ro>;

// Where an array lives: host memory, or CUDA device `device` of this process.
struct Placement {
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  bool on_device() const { return memory == MemoryKind::kCuda; }
  std::string str() const;  // "host memory", "CUDA device 1"
};
// Throws naming `name` for memory ringattn cannot reach (another vendor's device, or a CUDA array in a
// build without CUDA).
Placement placement_of(const AnyArray& array, const char* name);

// `array` (host or CUDA memory) viewed as a TensorView; `name` and `expected_rank` make the error.
TensorView view_of(const AnyArray& array, const char* name, size_t expected_rank);
// The same, also checking that it lives where the call's q does (`where`), naming both.
TensorView view_of(const AnyArray& array, const char* name, size_t expected_rank, const Placement& where);
// An optional array the same way: an undefined view where none is given.
TensorView optional_view_of(const std::optional<AnyArray>& array, const char* name, size_t expected_rank,
                            const Placement& where);

// Which framework the results go back to: the one `like` came from (numpy unless it is a PyTorch, JAX
// or CuPy array; a device result for a numpy caller comes back as a bare DLPack array).
enum class Framework { kNumpy, kTorch, kJax, kCupy };
Framework framework_of(nb::handle like);

// `t` moved into an array of `framework` (on CUDA device `device` when `t` is in device memory), which
// owns it from here on.
nb::object to_array(Tensor t, Framework framework, int device = 0);

}  // namespace ra::python
