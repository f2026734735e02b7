// Raw memory of either kind behind one interface, so that tensors, carries and copies need not know
// whether they live on the host or on a CUDA device. In a build without CUDA, asking for device
// memory throws a clear error instead of failing to link.
#pragma once

#include <cstddef>
#include <memory>

#include "runtime/tensor.h"

namespace ra {

// True when this build has the CUDA back end compiled in (independent of whether a GPU is present).
bool built_with_cuda();

// `what` names the tensor in the out-of-memory message (with the bytes asked for and the bytes free).
void* allocate_bytes(size_t bytes, MemoryKind memory, const char* what);
void release_bytes(void* p, MemoryKind memory);
void fill_zero_bytes(void* p, size_t bytes, MemoryKind memory);
// Device memory for one call's temporaries from ringattn's cache (runtime/cuda_device.h), allocated,
// zeroed and released in the order of `cuda_stream` (a cudaStream_t; nullptr: the legacy default
// stream) without waiting for the device; host memory as above.
void* allocate_temporary_bytes(size_t bytes, MemoryKind memory, void* cuda_stream, const char* what);
void release_temporary_bytes(void* p, MemoryKind memory, void* cuda_stream);
void fill_zero_temporary_bytes(void* p, size_t bytes, MemoryKind memory, void* cuda_stream);

// The device caches of call temporaries (runtime/cuda_device.h), over this process's GPUs: the bytes they
// hold for reuse, handing them back to the driver, and the bound of each. Without CUDA: 0, nothing to do.
size_t device_cache_bytes();
void release_device_cache();
void set_device_cache_limit(size_t bytes);

// Copies between two contiguous views of the same dtype and element count, any memory kinds.
// Synchronous with respect to the host (device work already queued on the legacy stream finishes first).
void copy_tensor(const TensorView& dst, const TensorView& src);

// A contiguous copy of `src` in `memory` (a host copy of a device tensor, or the reverse).
Tensor to_memory(const TensorView& src, MemoryKind memory);

// Grow-only scratch for buffers reused across calls: afterwards `t` is a u8 tensor of at least `bytes`
// bytes in `memory` (reallocated, contents zeroed, only when it was smaller). Freeing the old device or
// pinned buffer waits for the device, so queued work that still reads it is safe.
void reserve_scratch(Tensor& t, size_t bytes, MemoryKind memory, const char* what);

// Sets every element of a contiguous f32 view to `value`.
void fill_f32(const TensorView& dst, float value);

// Makes CUDA device `device` the calling thread's current one while it lives, then the previous one
// again: a caller's arrays may live on any GPU of the process (throws in a build without CUDA).
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int device);
  ~ScopedCudaDevice();
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

 private:
  int previous_ = -1;
};

// A call's device work on a side stream (one per device, thread and caller's stream, kept between calls),
// ordered after everything queued on `caller` (a cudaStream_t; nullptr: the legacy default stream) before
// it, with `caller` ordered after that work when this ends: the caller sees the results on its stream, as
// DLPack's exchange expects. Why not the
// caller's stream itself: ringattn's device allocations zero-fill on the legacy default stream and wait
// for it, which on a caller's legacy stream would also wait for every kernel of the call queued so far.
// (Measured on one H200 at T=32768: no difference in time either way; those waits are short beside the
// kernels. Kept so that no allocation inside a call drains the caller's queue.) Where `caller` is being
// captured into a CUDA graph, the side stream joins the capture and the call is a CapturedCall
// (runtime/graph_capture.h) while this lives. Throws without CUDA.
class CapturedCall;
class SideStream {
 public:
  explicit SideStream(void* caller);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  void* get() const { return stream_; }
  bool captured() const { return captured_ != nullptr; }

 private:
  void* caller_ = nullptr;
  void* stream_ = nullptr;
  void* event_ = nullptr;
  std::unique_ptr<CapturedCall> captured_;
};

// Destroys the kept side streams (at interpreter exit, while CUDA is up); a later SideStream makes new ones.
void release_side_streams();

}  // namespace ra
