// Static-switch dispatch from runtime values (dtype, head dim, flags) to template instances. Every
// switch's default throws naming the value and what the kernel has: a value a kernel was not built
// for is refused, never run as a neighbouring instance.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "runtime/dtype.h"
#include "runtime/error.h"

namespace ra {

// f(T{}) with T the CUDA element type of a 16-bit float dtype.
template <typename F>
void dispatch_half_dtype(DType dtype, const char* kernel, F&& f) {
  switch (dtype) {
    case DType::kF16: f(__half{}); return;
    case DType::kBF16: f(__nv_bfloat16{}); return;
    default: RA_FAIL(kernel, " has no instance for dtype ", dtype_name(dtype), " (it takes f16 or bf16)");
  }
}

// f(std::integral_constant<int, D>{}) for the D in kDims equal to head_dim.
template <int... kDims, typename F>
void dispatch_head_dim(int64_t head_dim, const char* kernel, F&& f) {
  const bool found = ((head_dim == kDims ? (f(std::integral_constant<int, kDims>{}), true) : false) || ...);
  if (!found) {
    const int dims[] = {kDims...};
    std::string have;
    for (int d : dims) have += (have.empty() ? "" : ", ") + std::to_string(d);
    RA_FAIL(kernel, " has no instance for head_dim ", head_dim, " (it has ", have, ")");
  }
}

// f(std::bool_constant<flag>{}).
template <typename F>
void dispatch_bool(bool flag, F&& f) {
  if (flag) f(std::true_type{});
  else f(std::false_type{});
}

// The head dims a flash kernel has instances of (the classes dispatch_flash_instance picks from).
template <int... kDims>
struct InstanceDims {};

// The flash kernels' instance for these head dims: f(std::integral_constant<int, D>{}, std::bool_constant<padded>{})
// with D the smallest instance of Classes (64, 128 and 256 unless a kernel has more) that holds head_dim and
// value_dim, padded where either is narrower (its columns past the head dims loaded as zeros and never
// stored: zero products, so the compute is the instance's and the memory traffic the head dims').
// kExactDims: the D that have an instance of their own for exact head dims; at the others the padded
// instance (whose column bounds are runtime tests) runs exact head dims too, one instance fewer to build
// where the kernel measured no slower so (a kernel's choice, beside its launch).
template <typename Classes, int... kExactDims, typename F>
void dispatch_flash_instance_of(int head_dim, int value_dim, const char* kernel, F&& f) {
  const int widest = head_dim > value_dim ? head_dim : value_dim;
  [&]<int... kDims>(InstanceDims<kDims...>) {
    int instance_dim = 0;  // the smallest class that holds both (none: the head dim, refused by name)
    ((instance_dim == 0 && widest <= kDims ? instance_dim = kDims : 0), ...);
    dispatch_head_dim<kDims...>(instance_dim == 0 ? widest : instance_dim, kernel, [&](auto instance) {
      constexpr int D = decltype(instance)::value;
      if constexpr (((D == kExactDims) || ...)) {
        dispatch_bool(head_dim != D || value_dim != D, [&](auto padded) { f(instance, padded); });
      } else {
        f(instance, std::true_type{});
      }
    });
  }(Classes{});
}

template <int... kExactDims, typename F>
void dispatch_flash_instance(int head_dim, int value_dim, const char* kernel, F&& f) {
  dispatch_flash_instance_of<InstanceDims<64, 128, 256>, kExactDims...>(head_dim, value_dim, kernel, std::forward<F>(f));
}

}  // namespace ra
