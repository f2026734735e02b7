#include "arrays.h"

#include <nanobind/stl/string.h>

#include <utility>

#include "runtime/error.h"

namespace ra::python {
namespace {

DType dtype_of(const nb::dlpack::dtype& t, const char* name) {
  using Code = nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == uint8_t(Code::Float) && t.bits == 32) return DType::kF32;
    if (t.code == uint8_t(Code::Float) && t.bits == 16) return DType::kF16;
    if (t.code == uint8_t(Code::Bfloat) && t.bits == 16) return DType::kBF16;
    if (t.code == uint8_t(Code::Float) && t.bits == 64) return DType::kF64;
    if (t.code == uint8_t(Code::Int) && t.bits == 32) return DType::kI32;
    if ((t.code == uint8_t(Code::UInt) || t.code == uint8_t(Code::Bool)) && t.bits == 8) return DType::kU8;
  }
  RA_FAIL(name, " has a dtype ringattn does not take (DLPack code ", int(t.code), ", ", int(t.bits),
          " bits): expected float32, float16 or bfloat16 (int32 segment ids, bool / uint8 mask)");
}

nb::dlpack::dtype dlpack_dtype(DType dtype) {
  using Code = nb::dlpack::dtype_code;
  switch (dtype) {
    case DType::kF32: return {uint8_t(Code::Float), 32, 1};
    case DType::kF16: return {uint8_t(Code::Float), 16, 1};
    case DType::kBF16: return {uint8_t(Code::Bfloat), 16, 1};
    case DType::kF64: return {uint8_t(Code::Float), 64, 1};
    case DType::kI32: return {uint8_t(Code::Int), 32, 1};
    case DType::kU8: return {uint8_t(Code::UInt), 8, 1};
  }
  RA_FAIL("unknown dtype");
}

template <typename Kind>
nb::object wrap(Tensor* owned) {
  const TensorView v = owned->view();
  size_t shape[kMaxRank];
  int64_t strides[kMaxRank];
  for (int d = 0; d < v.rank(); ++d) shape[d] = size_t(v.dim(d)), strides[d] = v.stride(d);
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return nb::cast(nb::ndarray<Kind>(v.data(), size_t(v.rank()), shape, owner, strides, dlpack_dtype(v.dtype())),
                  nb::rv_policy::reference);
}

}  // namespace

TensorView view_of(const AnyArray& array, const char* name, size_t expected_rank) {
  RA_CHECK(array.ndim() == expected_rank && expected_rank <= size_t(kMaxRank), name, " has ", array.ndim(), " dimensions, expected ", expected_rank);
  RA_CHECK(array.device_type() == nb::device::cpu::value, name, " is not in host memory: this version of the Python "
           "core runs host arrays (numpy, or PyTorch / JAX arrays on the CPU); device arrays come with its GPU path");
  Shape shape;
  shape.rank = int(array.ndim());
  std::array<int64_t, kMaxRank> strides{};
  for (size_t d = 0; d < array.ndim(); ++d) {
    shape[int(d)] = int64_t(array.shape(d));
    strides[d] = array.stride(d);
  }
  return TensorView(const_cast<void*>(array.data()), dtype_of(array.dtype(), name), shape, strides, MemoryKind::kHost);
}

Framework framework_of(nb::handle like) {
  const std::string module = nb::cast<std::string>(nb::handle(like.type()).attr("__module__"));
  if (module.rfind("torch", 0) == 0) return Framework::kTorch;
  if (module.rfind("jax", 0) == 0 || module.rfind("jaxlib", 0) == 0) return Framework::kJax;
  return Framework::kNumpy;
}

nb::object to_array(Tensor t, Framework framework) {
  auto* owned = new Tensor(std::move(t));
  switch (framework) {
    case Framework::kTorch: return wrap<nb::pytorch>(owned);
    case Framework::kJax: return wrap<nb::jax>(owned);
    case Framework::kNumpy: break;
  }
  return wrap<nb::numpy>(owned);
}

}  // namespace ra::python
