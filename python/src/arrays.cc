#include "arrays.h"

#include <nanobind/stl/string.h>

#include <string_view>
#include <utility>

#include "runtime/error.h"
#include "runtime/memory.h"

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
    if (t.code == uint8_t(Code::UInt) && t.bits == 8) return DType::kU8;
    // Booleans are taken as the mask's bytes; anything else would be misnamed as u8 in its refusal.
    if (t.code == uint8_t(Code::Bool) && t.bits == 8) {
      RA_CHECK(std::string_view(name) == "mask", name, " has dtype bool, which only the mask may have");
      return DType::kU8;
    }
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

template <typename... Kind>
nb::object wrap(Tensor* owned, int device) {
  const TensorView v = owned->view();
  size_t shape[kMaxRank];
  int64_t strides[kMaxRank];
  for (int d = 0; d < v.rank(); ++d) shape[d] = size_t(v.dim(d)), strides[d] = v.stride(d);
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  const bool on_device = v.memory() == MemoryKind::kCuda;
  return nb::cast(nb::ndarray<Kind...>(v.data(), size_t(v.rank()), shape, owner, strides, dlpack_dtype(v.dtype()),
                                       on_device ? nb::device::cuda::value : nb::device::cpu::value,
                                       on_device ? device : 0),
                  nb::rv_policy::reference);
}

}  // namespace

std::string Placement::str() const {
  return on_device() ? "CUDA device " + std::to_string(device) : std::string("host memory");
}

Placement placement_of(const AnyArray& array, const char* name) {
  const int type = array.device_type();
  if (type == nb::device::cpu::value) return {};
  RA_CHECK(type == nb::device::cuda::value, name, " lives on a DLPack device of type ", type,
           ", expected host memory or a CUDA device");
  RA_CHECK(built_with_cuda(), name, " is on CUDA device ", array.device_id(), ", but this build of ringattn has no "
           "CUDA back end (configure with -DRA_ENABLE_CUDA=ON where nvcc is)");
  return {MemoryKind::kCuda, array.device_id()};
}

TensorView view_of(const AnyArray& array, const char* name, size_t expected_rank, const Placement& where) {
  const Placement here = placement_of(array, name);
  RA_CHECK(here.memory == where.memory && here.device == where.device, name, " is in ", here.str(), " but q is in ",
           where.str(), ": every array of a call lives where q does");
  return view_of(array, name, expected_rank);
}

TensorView optional_view_of(const std::optional<AnyArray>& array, const char* name, size_t expected_rank,
                            const Placement& where) {
  return array ? view_of(*array, name, expected_rank, where) : TensorView();
}

TensorView view_of(const AnyArray& array, const char* name, size_t expected_rank) {
  RA_CHECK(array.ndim() == expected_rank && expected_rank <= size_t(kMaxRank), name, " has ", array.ndim(), " dimensions, expected ", expected_rank);
  const Placement where = placement_of(array, name);
  Shape shape;
  shape.rank = int(array.ndim());
  std::array<int64_t, kMaxRank> strides{};
  for (size_t d = 0; d < array.ndim(); ++d) {
    shape[int(d)] = int64_t(array.shape(d));
    strides[d] = array.stride(d);
  }
  // An array with no elements may have no memory (PyTorch's empty tensors: a null pointer), which a view
  // reads as "not given": point it at a byte of its own, never read (no element to read).
  static char no_elements;
  void* data = array.size() == 0 && array.data() == nullptr ? &no_elements : const_cast<void*>(array.data());
  return TensorView(data, dtype_of(array.dtype(), name), shape, strides, where.memory);
}

Framework framework_of(nb::handle like) {
  const std::string module = nb::cast<std::string>(nb::handle(like.type()).attr("__module__"));
  if (module.rfind("torch", 0) == 0) return Framework::kTorch;
  if (module.rfind("jax", 0) == 0 || module.rfind("jaxlib", 0) == 0) return Framework::kJax;
  if (module.rfind("cupy", 0) == 0) return Framework::kCupy;
  return Framework::kNumpy;
}

nb::object to_array(Tensor t, Framework framework, int device) {
  auto* owned = new Tensor(std::move(t));
  switch (framework) {
    case Framework::kTorch: return wrap<nb::pytorch>(owned, device);
    case Framework::kJax: return wrap<nb::jax>(owned, device);
    case Framework::kCupy: return wrap<nb::cupy>(owned, device);
    case Framework::kNumpy: break;
  }
  // numpy holds host memory only: a device result is a bare DLPack array (any framework's from_dlpack takes it).
  if (owned->view().memory() == MemoryKind::kCuda) return wrap<>(owned, device);
  return wrap<nb::numpy>(owned, device);
}

}  // namespace ra::python
