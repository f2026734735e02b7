// CUDA runtime wrappers. Errors become ra::Error with the call and the CUDA error's name.
#include "runtime/cuda_device.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include <thread>
#include <utility>

namespace ra {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver / no device" status
    return 0;
  }
  return count;
}

int cuda_select_device(int local_rank) {
  const int count = cuda_device_count();
  RA_CHECK(count > 0, "--backend cuda needs a CUDA device, but none is visible to this process "
           "(check the driver and CUDA_VISIBLE_DEVICES)");
  const int device = local_rank % count;
  RA_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

size_t cuda_bytes_free() {
  size_t free_bytes = 0, total_bytes = 0;
  RA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

size_t cuda_bytes_in_use() {
  size_t free_bytes = 0, total_bytes = 0;
  RA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes - free_bytes;
}

namespace {

// Device bytes held by ringattn's own allocations (tensors, scratch, library workspaces it hands out):
// the current total and its high-water mark since the last reset.
struct AllocationTracker {
  std::mutex mutex;
  std::unordered_map<void*, size_t> sizes;
  size_t current = 0, peak = 0;
};
AllocationTracker& tracker() {
  static AllocationTracker t;
  return t;
}

}  // namespace

size_t cuda_allocated_peak_bytes() {
  std::lock_guard<std::mutex> lock(tracker().mutex);
  return tracker().peak;
}

void cuda_reset_allocated_peak() {
  std::lock_guard<std::mutex> lock(tracker().mutex);
  tracker().peak = tracker().current;
}

void* cuda_allocate(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes ? bytes : 1);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    RA_FAIL("out of device memory: ", what, " needs ", bytes, " bytes but only ", free_bytes, " of ", total_bytes,
            " bytes are free on the device (", cudaGetErrorName(status), "); use more ranks or a shorter sequence");
  }
  std::lock_guard<std::mutex> lock(tracker().mutex);
  tracker().sizes[p] = bytes;
  tracker().current += bytes;
  tracker().peak = std::max(tracker().peak, tracker().current);
  return p;
}

void cuda_release(void* p) {
  {
    std::lock_guard<std::mutex> lock(tracker().mutex);
    auto it = tracker().sizes.find(p);
    if (it != tracker().sizes.end()) {
      tracker().current -= it->second;
      tracker().sizes.erase(it);
    }
  }
  (void)cudaFree(p);
}

void cuda_memset_zero(void* p, size_t bytes) {
  RA_CUDA_CHECK(cudaMemset(p, 0, bytes));
  // cudaMemset may return early, and work on non-blocking streams does not wait for it.
  RA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void cuda_copy(void* dst, const void* src, size_t bytes) { RA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault)); }

void* cuda_allocate_pinned(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t status = cudaMallocHost(&p, bytes ? bytes : 1);
  RA_CHECK(status == cudaSuccess, "pinned host allocation of ", bytes, " bytes for ", what, " failed: ",
           cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
  return p;
}

void cuda_release_pinned(void* p) { (void)cudaFreeHost(p); }

CudaStream::CudaStream(StreamPriority priority) {
  int least = 0, greatest = 0;  // numerically, greatest < least
  RA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  RA_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking,
                                             priority == StreamPriority::kHigh ? greatest : least));
}
CudaStream::~CudaStream() { (void)cudaStreamDestroy(stream_); }
void CudaStream::synchronize() const { RA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

CudaEvent::CudaEvent(bool timing) {
  RA_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
CudaEvent::~CudaEvent() { (void)cudaEventDestroy(event_); }
void CudaEvent::record(cudaStream_t stream) const { RA_CUDA_CHECK(cudaEventRecord(event_, stream)); }

float CudaEvent::milliseconds_since(const CudaEvent& start) const {
  float ms = 0;
  RA_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

cudaError_t poll_event(cudaEvent_t event, std::chrono::milliseconds timeout, const std::function<void()>& between_polls) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const cudaError_t status = cudaEventQuery(event);
    if (status != cudaErrorNotReady) return status;
    if (between_polls) between_polls();
    if (std::chrono::steady_clock::now() > deadline) return cudaErrorTimeout;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace ra
