// Host memory through aligned_alloc; device memory through the CUDA runtime when it is built in.
#include "runtime/memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "runtime/error.h"
#include "runtime/graph_capture.h"

#if RA_HAVE_CUDA
#include "runtime/capture_mode.h"
#include "runtime/cuda_device.h"
#endif

namespace ra {

bool built_with_cuda() { return RA_HAVE_CUDA != 0; }

namespace {

#if !RA_HAVE_CUDA
[[noreturn]] void no_cuda(const char* what) {
  RA_FAIL("device or pinned host memory for ", what, " was asked for, but this build of ringattn has no CUDA back end "
          "(configure with -DRA_ENABLE_CUDA=ON on a machine with nvcc)");
}
#endif

}  // namespace

void* allocate_bytes(size_t bytes, MemoryKind memory, const char* what) {
  if (memory == MemoryKind::kHost) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded ? rounded : 64);
    RA_CHECK(p != nullptr, "host allocation of ", bytes, " bytes for ", what, " failed");
    return p;
  }
#if RA_HAVE_CUDA
  return memory == MemoryKind::kPinned ? cuda_allocate_pinned(bytes, what) : cuda_allocate(bytes, what);
#else
  no_cuda(what);
#endif
}

void release_bytes(void* p, MemoryKind memory) {
  if (p == nullptr) return;
  if (memory == MemoryKind::kHost) {
    std::free(p);
    return;
  }
#if RA_HAVE_CUDA
  if (memory == MemoryKind::kPinned) return cuda_release_pinned(p);
  cuda_release(p);
#endif
}

void fill_zero_bytes(void* p, size_t bytes, MemoryKind memory) {
  if (host_accessible(memory)) {
    std::memset(p, 0, bytes);
    return;
  }
#if RA_HAVE_CUDA
  cuda_memset_zero(p, bytes);
#else
  no_cuda("a zero fill");
#endif
}

void* allocate_temporary_bytes(size_t bytes, MemoryKind memory, void* cuda_stream, const char* what) {
#if RA_HAVE_CUDA
  if (memory == MemoryKind::kCuda) return cuda_allocate_temporary(bytes, static_cast<cudaStream_t>(cuda_stream), what);
#endif
  (void)cuda_stream;
  return allocate_bytes(bytes, memory, what);
}

void release_temporary_bytes(void* p, MemoryKind memory, void* cuda_stream) {
#if RA_HAVE_CUDA
  if (p != nullptr && memory == MemoryKind::kCuda) return cuda_release_temporary(p, static_cast<cudaStream_t>(cuda_stream));
#endif
  (void)cuda_stream;
  release_bytes(p, memory);
}

void fill_zero_temporary_bytes(void* p, size_t bytes, MemoryKind memory, void* cuda_stream) {
#if RA_HAVE_CUDA
  if (memory == MemoryKind::kCuda) return cuda_memset_zero_async(p, bytes, static_cast<cudaStream_t>(cuda_stream));
#endif
  (void)cuda_stream;
  fill_zero_bytes(p, bytes, memory);
}

#if RA_HAVE_CUDA
size_t device_cache_bytes() { return cuda_cached_bytes(); }
void release_device_cache() { cuda_release_cached(); }
void set_device_cache_limit(size_t bytes) { cuda_set_cache_limit(bytes); }
#else
size_t device_cache_bytes() { return 0; }
void release_device_cache() {}
void set_device_cache_limit(size_t) {}
#endif

void copy_tensor(const TensorView& dst, const TensorView& src) {
  RA_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "copy between tensors of ",
           dtype_name(src.dtype()), " ", src.shape().str(), " and ", dtype_name(dst.dtype()), " ", dst.shape().str());
  RA_CHECK(dst.is_contiguous() && src.is_contiguous(), "copy_tensor needs contiguous tensors");
  if (host_accessible(dst.memory()) && host_accessible(src.memory())) {
    std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
#if RA_HAVE_CUDA
  cuda_copy(dst.data(), src.data(), src.nbytes());
#else
  no_cuda("a copy");
#endif
}

Tensor to_memory(const TensorView& src, MemoryKind memory) {
  Tensor out(src.dtype(), src.shape(), memory);
  copy_tensor(out.view(), src);
  return out;
}

void reserve_scratch(Tensor& t, size_t bytes, MemoryKind memory, const char* what) {
  if (t.defined() && t.view().memory() == memory && t.view().nbytes() >= bytes) return;
  t = Tensor();  // free first: the old and the new buffer need not fit together
  try {
    t = Tensor(DType::kU8, {int64_t(std::max<size_t>(bytes, 1))}, memory);
  } catch (const Error& e) {
    RA_FAIL(what, ": ", e.message());
  }
}

void fill_f32(const TensorView& dst, float value) {
  RA_CHECK(dst.dtype() == DType::kF32 && dst.is_contiguous(), "fill_f32 needs a contiguous f32 tensor");
  if (host_accessible(dst.memory())) {
    float* p = dst.data_as<float>();
    for (int64_t i = 0; i < dst.numel(); ++i) p[i] = value;
    return;
  }
  std::vector<float> host(size_t(dst.numel()), value);
  copy_tensor(dst, TensorView(host.data(), DType::kF32, dst.shape()));
}

#if RA_HAVE_CUDA
ScopedCudaDevice::ScopedCudaDevice(int device) {
  RA_CUDA_CHECK(cudaGetDevice(&previous_));
  if (device != previous_) RA_CUDA_CHECK(cudaSetDevice(device));
}
ScopedCudaDevice::~ScopedCudaDevice() { (void)cudaSetDevice(previous_); }

namespace {
// `waiter` waits for the work queued on `signaller` so far (a wait takes the event's latest record, so
// one event serves every wait in turn).
cudaError_t order_after(cudaStream_t waiter, cudaStream_t signaller, cudaEvent_t event) {
  cudaError_t status = cudaEventRecord(event, signaller);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(waiter, event, 0);
  return status;
}

// The side streams and their events, one pair per (device, thread, caller's stream), made at the first
// call so and kept: a stream and an event made and destroyed by every call cost about 0.1 ms a call, and
// what implementations keep per stream (cudnn's scratch) was remade with each new one. Per caller's stream,
// so that calls a thread queues on two streams of its own still overlap; per thread, so that no two
// threads record one event at once. Never destroyed at exit, where CUDA may be torn down first:
// release_side_streams() frees them while it is up.
struct KeptStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
};
using KeptStreamKey = std::tuple<int, std::thread::id, cudaStream_t>;
struct KeptStreams {
  std::mutex mutex;
  std::map<KeptStreamKey, KeptStream> streams;
};
KeptStreams& kept_streams() {
  static KeptStreams* kept = new KeptStreams;
  return *kept;
}

KeptStream& side_stream_for(cudaStream_t caller) {
  int device = 0;
  RA_CUDA_CHECK(cudaGetDevice(&device));
  KeptStreams& kept = kept_streams();
  std::lock_guard<std::mutex> lock(kept.mutex);
  KeptStream& s = kept.streams[{device, std::this_thread::get_id(), caller}];
  if (s.stream == nullptr) {
    const RelaxedCaptureMode relaxed;  // the caller's stream may be capturing (PyTorch's capture stream)
    RA_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    RA_CUDA_CHECK(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming));
  }
  return s;
}
}  // namespace

SideStream::SideStream(void* caller) : caller_(caller) {
  KeptStream& kept = side_stream_for(static_cast<cudaStream_t>(caller));
  stream_ = kept.stream;
  event_ = kept.event;
  const bool capturing = cuda_stream_capturing(caller);
  const cudaError_t status = order_after(kept.stream, static_cast<cudaStream_t>(caller), kept.event);
  RA_CHECK(status == cudaSuccess, "ordering a call's stream after the caller's failed: ", cudaGetErrorName(status));
  if (capturing) captured_ = std::make_unique<CapturedCall>();
}

SideStream::~SideStream() {
  captured_.reset();  // its temporaries released on the side stream, before the caller waits for it
  (void)order_after(static_cast<cudaStream_t>(caller_), static_cast<cudaStream_t>(stream_),
                    static_cast<cudaEvent_t>(event_));
}

void release_side_streams() {
  std::map<KeptStreamKey, KeptStream> gone;
  {
    KeptStreams& kept = kept_streams();
    std::lock_guard<std::mutex> lock(kept.mutex);
    gone.swap(kept.streams);
  }
  for (auto& [where, s] : gone) {  // each released once its work is done
    (void)cudaStreamDestroy(s.stream);
    (void)cudaEventDestroy(s.event);
  }
}
#else
ScopedCudaDevice::ScopedCudaDevice(int) { no_cuda("CUDA device selection"); }
ScopedCudaDevice::~ScopedCudaDevice() = default;
SideStream::SideStream(void*) { no_cuda("a CUDA stream"); }
SideStream::~SideStream() = default;
void release_side_streams() {}
#endif

}  // namespace ra
