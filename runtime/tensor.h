// Tensors: a non-owning view (pointer, dtype, shape, strides in elements, memory kind) and an owning
// host tensor in an aligned RAII buffer. Views of caller-owned memory cost nothing.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace ra {

inline constexpr int kMaxRank = 4;

// kPinned: page-locked host memory (CUDA builds only), where HDF5 slices land before they go to a GPU
// and where results come back: the host reads and writes it like kHost, copies to and from a device
// are DMA at full speed.
enum class MemoryKind : uint8_t { kHost, kCuda, kPinned };
inline bool host_accessible(MemoryKind memory) { return memory != MemoryKind::kCuda; }

struct Shape {
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> list);
  static Shape of(const std::vector<int64_t>& list);
  int64_t operator[](int i) const { return dims[i]; }
  int64_t& operator[](int i) { return dims[i]; }
  int64_t numel() const;
  std::string str() const;  // "(2, 16, 4, 64)"
  bool operator==(const Shape& other) const;
};

class TensorView {
 public:
  TensorView() = default;
  // Contiguous row-major view.
  TensorView(void* data, DType dtype, Shape shape, MemoryKind memory = MemoryKind::kHost);
  TensorView(void* data, DType dtype, Shape shape, std::array<int64_t, kMaxRank> strides,
             MemoryKind memory = MemoryKind::kHost);

  bool defined() const { return data_ != nullptr; }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t stride(int i) const { return strides_[i]; }
  const std::array<int64_t, kMaxRank>& strides() const { return strides_; }
  MemoryKind memory() const { return memory_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::array<int64_t, kMaxRank> strides_{};
  MemoryKind memory_ = MemoryKind::kHost;
};

// Owning, contiguous, zero-initialised tensor in host memory (64-byte aligned), pinned host memory or
// CUDA device memory (runtime/memory.h allocates; kCuda and kPinned throw in a build without CUDA).
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape, MemoryKind memory = MemoryKind::kHost);
  // A tensor for the span of one call whose device work is queued on `cuda_stream` (a cudaStream_t;
  // nullptr: the legacy default stream): on a device it comes from ringattn's cache, zeroed and given
  // back in that stream's order with no wait for the device (runtime/memory.h). So it must die while
  // the stream lives, and work of other streams that uses it must be ordered before the stream's later
  // work. On the host: as the constructor.
  static Tensor temporary(DType dtype, Shape shape, MemoryKind memory, void* cuda_stream);
  // The same as `bytes` u8 left unset, for a kernel that writes all it reads (named `what` in an
  // out-of-memory error): a small call's temporaries then cost no fill.
  static Tensor scratch(size_t bytes, MemoryKind memory, void* cuda_stream, const char* what);

  TensorView view() const { return view_; }
  operator TensorView() const { return view_; }
  template <typename T>
  T* data() const { return view_.data_as<T>(); }
  const Shape& shape() const { return view_.shape(); }
  DType dtype() const { return view_.dtype(); }
  int64_t numel() const { return view_.numel(); }
  bool defined() const { return view_.defined(); }

 private:
  struct Release {
    Release() {}
    Release(MemoryKind kind, bool from_cache, void* stream) : memory(kind), temporary(from_cache), cuda_stream(stream) {}
    MemoryKind memory = MemoryKind::kHost;
    bool temporary = false;  // from the device cache, released on `cuda_stream`
    void* cuda_stream = nullptr;
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Release> storage_;
  TensorView view_;
};

// Whether two views' byte spans (from their lowest to their highest element) meet: views that share memory, or
// strided ones whose elements interleave (taken as sharing). Empty views meet nothing.
bool spans_meet(const TensorView& a, const TensorView& b);

// The sub-view of rows [start, start + length) along `dim` (no copy).
TensorView narrow(const TensorView& view, int dim, int64_t start, int64_t length);

// Row-major strides of a shape.
std::array<int64_t, kMaxRank> contiguous_strides(const Shape& shape);

// A broadcast view: `view` (rank <= target rank, dims 1 or equal, aligned right as in numpy)
// seen with `target` shape and stride 0 on broadcast dims. Throws naming `name` and the dimension.
TensorView broadcast_to(const TensorView& view, const Shape& target, const char* name);

}  // namespace ra
