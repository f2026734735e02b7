// Shapes, strides, owning tensors and numpy-style broadcasting of views.
#include "runtime/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra {

Shape::Shape(std::initializer_list<int64_t> list) {
  RA_CHECK(list.size() <= kMaxRank, "tensor rank ", list.size(), " exceeds the maximum of ", kMaxRank);
  for (int64_t d : list) dims[rank++] = d;
}

Shape Shape::of(const std::vector<int64_t>& list) {
  RA_CHECK(list.size() <= kMaxRank, "tensor rank ", list.size(), " exceeds the maximum of ", kMaxRank);
  Shape shape;
  for (int64_t d : list) shape.dims[shape.rank++] = d;
  return shape;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  return n;
}

std::string Shape::str() const {
  std::ostringstream out;
  out << "(";
  for (int i = 0; i < rank; ++i) out << (i ? ", " : "") << dims[i];
  out << ")";
  return out.str();
}

bool Shape::operator==(const Shape& other) const {
  if (rank != other.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[i] != other.dims[i]) return false;
  return true;
}

std::array<int64_t, kMaxRank> contiguous_strides(const Shape& shape) {
  std::array<int64_t, kMaxRank> strides{};
  int64_t s = 1;
  for (int i = shape.rank - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

TensorView::TensorView(void* data, DType dtype, Shape shape, MemoryKind memory)
    : TensorView(data, dtype, shape, contiguous_strides(shape), memory) {}

TensorView::TensorView(void* data, DType dtype, Shape shape, std::array<int64_t, kMaxRank> strides,
                       MemoryKind memory)
    : data_(data), dtype_(dtype), shape_(shape), strides_(strides), memory_(memory) {
  for (int i = 0; i < shape.rank; ++i) RA_CHECK(shape[i] >= 0, "negative dimension ", i, " in shape ", shape.str());
  // A dimension of one element is never stepped along, so its stride means nothing, and frameworks leave anything
  // there (PyTorch a broadcast's 0 through contiguous(), NumPy a negative one). It takes the value a contiguous view
  // would have: such a view is contiguous where the rest of it is, and the TMA unit (positive strides in 16-byte
  // multiples) and cuDNN map it.
  for (int i = shape.rank - 1; i >= 0; --i)
    if (shape[i] == 1) strides_[i] = i + 1 < shape.rank ? strides_[i + 1] * std::max<int64_t>(shape[i + 1], 1) : 1;
}

// No elements: contiguous whatever the strides (PyTorch's empty tensors count a zero dimension as 1 in them).
bool TensorView::is_contiguous() const { return shape_.numel() == 0 || strides_ == contiguous_strides(shape_); }

namespace {
// What an allocation failure names: "a bf16 tensor of shape (1, 4096, 32, 128)", "an f32 tensor ...".
std::string tensor_description(DType dtype, const Shape& shape) {
  const std::string name(dtype_name(dtype));
  return (name[0] == 'f' ? "an " : "a ") + name + " tensor of shape " + shape.str();
}
}  // namespace

void Tensor::Release::operator()(void* p) const {
  if (temporary)
    release_temporary_bytes(p, memory, cuda_stream);
  else
    release_bytes(p, memory);
}

Tensor::Tensor(DType dtype, Shape shape, MemoryKind memory) {
  const size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  void* p = allocate_bytes(bytes, memory, tensor_description(dtype, shape).c_str());
  storage_ = std::unique_ptr<void, Release>(p, Release(memory, /*from_cache=*/false, nullptr));
  fill_zero_bytes(p, bytes, memory);
  view_ = TensorView(p, dtype, shape, memory);
}

Tensor Tensor::temporary(DType dtype, Shape shape, MemoryKind memory, void* cuda_stream) {
  const size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  Tensor t = scratch(bytes, memory, cuda_stream, tensor_description(dtype, shape).c_str());
  fill_zero_temporary_bytes(t.view_.data(), bytes, memory, cuda_stream);
  t.view_ = TensorView(t.view_.data(), dtype, shape, memory);
  return t;
}

Tensor Tensor::scratch(size_t bytes, MemoryKind memory, void* cuda_stream, const char* what) {
  Tensor t;
  void* p = allocate_temporary_bytes(bytes, memory, cuda_stream, what);
  t.storage_ = std::unique_ptr<void, Release>(p, Release(memory, /*from_cache=*/true, cuda_stream));
  t.view_ = TensorView(p, DType::kU8, Shape{int64_t(bytes)}, memory);
  return t;
}

namespace {

// [first, end) addresses of a non-empty view's bytes.
std::pair<uintptr_t, uintptr_t> byte_span(const TensorView& v) {
  int64_t low = 0, high = 0;  // element offsets of the lowest and highest element
  for (int d = 0; d < v.rank(); ++d) (v.stride(d) < 0 ? low : high) += (v.dim(d) - 1) * v.stride(d);
  const auto base = reinterpret_cast<uintptr_t>(v.data());
  const auto size = int64_t(dtype_size(v.dtype()));
  return {base + low * size, base + (high + 1) * size};
}

}  // namespace

bool spans_meet(const TensorView& a, const TensorView& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return false;
  const auto [a_first, a_end] = byte_span(a);
  const auto [b_first, b_end] = byte_span(b);
  return a_first < b_end && b_first < a_end;
}

TensorView narrow(const TensorView& view, int dim, int64_t start, int64_t length) {
  RA_CHECK(dim >= 0 && dim < view.rank() && start >= 0 && length >= 0 && start + length <= view.dim(dim),
           "narrow: rows [", start, ", ", start + length, ") of dimension ", dim, " are outside shape ",
           view.shape().str());
  Shape shape = view.shape();
  shape[dim] = length;
  char* base = static_cast<char*>(view.data()) + start * view.stride(dim) * int64_t(dtype_size(view.dtype()));
  return TensorView(base, view.dtype(), shape, view.strides(), view.memory());
}

TensorView broadcast_to(const TensorView& view, const Shape& target, const char* name) {
  RA_CHECK(view.rank() <= target.rank, name, " has rank ", view.rank(), " (shape ", view.shape().str(),
           "), expected at most ", target.rank, " to broadcast to ", target.str());
  std::array<int64_t, kMaxRank> strides{};
  int offset = target.rank - view.rank();
  for (int i = 0; i < target.rank; ++i) {
    int src = i - offset;
    if (src < 0) continue;  // missing leading dims broadcast
    int64_t d = view.dim(src);
    RA_CHECK(d == 1 || d == target[i], name, " dimension ", src, " is ", d, " (shape ", view.shape().str(),
             "), expected 1 or ", target[i], " to broadcast to ", target.str());
    strides[i] = d == 1 ? 0 : view.stride(src);
  }
  return TensorView(view.data(), view.dtype(), target, strides, view.memory());
}

}  // namespace ra
