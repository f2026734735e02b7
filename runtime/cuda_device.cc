// CUDA runtime wrappers. Errors become ra::Error with the call and the CUDA error's name.
#include "runtime/cuda_device.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include <thread>
#include <utility>
#include <vector>

#include "runtime/graph_capture.h"
#include "runtime/kept_temporaries.h"
#include "runtime/capture_mode.h"

namespace ra {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver / no device" status
    return 0;
  }
  return count;
}

void check_cuda_kernels_runnable() {
#if RA_CUDA_COMPILE_CHECK
  RA_CHECK(cuda_device_count() == 0, "this build's CUDA kernels were compiled only to check that they build "
           "(-DRA_CUDA_COMPILE_CHECK=ON, unoptimised: launch/setup.sh test does so where no GPU is visible) and do not "
           "run on GPUs; rebuild with -DRA_CUDA_COMPILE_CHECK=OFF (launch/setup.sh demo, or test on this machine)");
#endif
}

int cuda_select_device(int local_rank) {
  check_cuda_kernels_runnable();
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

namespace {

void track_allocation(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(tracker().mutex);
  tracker().sizes[p] = bytes;
  tracker().current += bytes;
  tracker().peak = std::max(tracker().peak, tracker().current);
}

void track_release(void* p) {
  std::lock_guard<std::mutex> lock(tracker().mutex);
  auto it = tracker().sizes.find(p);
  if (it != tracker().sizes.end()) {
    tracker().current -= it->second;
    tracker().sizes.erase(it);
  }
}

// The temporaries' pool of each device, made on first use (CUDA's pools live until the process ends).
struct TemporaryPools {
  std::mutex mutex;
  std::unordered_map<int, cudaMemPool_t> pools;
  uint64_t limit = UINT64_MAX;
};
TemporaryPools& temporary_pools() {
  static TemporaryPools p;
  return p;
}

cudaMemPool_t pool_of_current_device(bool create) {
  int device = 0;
  RA_CUDA_CHECK(cudaGetDevice(&device));
  TemporaryPools& all = temporary_pools();
  std::lock_guard<std::mutex> lock(all.mutex);
  auto it = all.pools.find(device);
  if (it != all.pools.end()) return it->second;
  if (!create) return nullptr;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  const RelaxedCaptureMode relaxed;  // the first temporary may be a captured call's
  RA_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  RA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &all.limit));
  all.pools[device] = pool;
  return pool;
}

[[noreturn]] void out_of_device_memory(size_t bytes, const char* what, cudaError_t status) {
  size_t free_bytes = 0, total_bytes = 0;
  (void)cudaMemGetInfo(&free_bytes, &total_bytes);
  RA_FAIL("out of device memory: ", what, " needs ", bytes, " bytes but only ", free_bytes, " of ", total_bytes,
          " bytes are free on the device (", cudaGetErrorName(status), "); use more ranks or a shorter sequence");
}

// Gives the driver every cached block whose release the device has reached, without waiting for it
// (a wait here could hang on a collective whose peer has died).
void trim_cache_now() {
  drop_kept_temporaries();
  if (cudaMemPool_t pool = pool_of_current_device(/*create=*/false)) (void)cudaMemPoolTrimTo(pool, 0);
}

// `allocate` once, and once more after handing the cache back when the device is full.
template <typename Allocate>
void* allocate_or_release_cache(size_t bytes, const char* what, Allocate allocate) {
  void* p = nullptr;
  cudaError_t status = allocate(&p);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    trim_cache_now();
    status = allocate(&p);
  }
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    out_of_device_memory(bytes, what, status);
  }
  track_allocation(p, bytes);
  return p;
}

}  // namespace

void* cuda_allocate(size_t bytes, const char* what) {
  refuse_under_capture("device memory that outlives the call", what);
  return allocate_or_release_cache(bytes, what, [&](void** p) { return cudaMalloc(p, bytes ? bytes : 1); });
}

void cuda_release(void* p) {
  track_release(p);
  (void)cudaFree(p);
}

void* cuda_allocate_temporary(size_t bytes, cudaStream_t stream, const char* what) {
  cudaMemPool_t pool = pool_of_current_device(/*create=*/true);
  return allocate_or_release_cache(bytes, what,
                                   [&](void** p) { return cudaMallocFromPoolAsync(p, bytes ? bytes : 1, pool, stream); });
}

void cuda_release_temporary(void* p, cudaStream_t stream) {
  track_release(p);
  (void)cudaFreeAsync(p, stream);
}

void cuda_memset_zero_async(void* p, size_t bytes, cudaStream_t stream) {
  RA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
}

namespace {
std::vector<std::pair<int, cudaMemPool_t>> every_pool() {
  TemporaryPools& all = temporary_pools();
  std::lock_guard<std::mutex> lock(all.mutex);
  return {all.pools.begin(), all.pools.end()};
}
}  // namespace

size_t cuda_cached_bytes() {
  size_t cached = 0;
  for (const auto& [device, pool] : every_pool()) {
    uint64_t reserved = 0, used = 0;
    RA_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    RA_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    cached += size_t(reserved - used);
  }
  return cached;
}

namespace {
struct Keepers {
  std::mutex mutex;
  std::vector<void (*)()> drops;
};
Keepers& keepers() {
  static auto* all = new Keepers;  // never destroyed: a keeper may drop at exit
  return *all;
}
}  // namespace

void drop_when_releasing_the_cache(void (*drop)()) {
  Keepers& all = keepers();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.drops.push_back(drop);
}

void drop_kept_temporaries() {
  std::vector<void (*)()> drops;
  {
    Keepers& all = keepers();
    std::lock_guard<std::mutex> lock(all.mutex);
    drops = all.drops;
  }
  for (auto drop : drops) drop();
}

void cuda_release_cached() {
  drop_kept_temporaries();  // their blocks freed in stream order, before the wait below
  const auto pools = every_pool();
  if (pools.empty()) return;  // also where there is no device
  int current = 0;
  RA_CUDA_CHECK(cudaGetDevice(&current));
  for (const auto& [device, pool] : pools) {
    RA_CUDA_CHECK(cudaSetDevice(device));
    RA_CUDA_CHECK(cudaDeviceSynchronize());  // blocks released on a stream are free once it gets there
    RA_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  }
  RA_CUDA_CHECK(cudaSetDevice(current));
}

void cuda_set_cache_limit(size_t bytes) {
  TemporaryPools& all = temporary_pools();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.limit = bytes;
  for (auto& [device, pool] : all.pools)
    RA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &all.limit));
}

void cuda_memset_zero(void* p, size_t bytes) {
  refuse_under_capture("a zero fill that waits for the device");
  RA_CUDA_CHECK(cudaMemset(p, 0, bytes));
  // cudaMemset may return early, and work on non-blocking streams does not wait for it.
  RA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void cuda_copy(void* dst, const void* src, size_t bytes) {
  refuse_under_capture("a copy that waits for the device");
  RA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void* cuda_allocate_pinned(size_t bytes, const char* what) {
  refuse_under_capture("pinned host memory", what);
  void* p = nullptr;
  const cudaError_t status = cudaMallocHost(&p, bytes ? bytes : 1);
  RA_CHECK(status == cudaSuccess, "pinned host allocation of ", bytes, " bytes for ", what, " failed: ",
           cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
  return p;
}

void cuda_release_pinned(void* p) { (void)cudaFreeHost(p); }

RelaxedCaptureMode::RelaxedCaptureMode() { RA_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&previous_)); }
RelaxedCaptureMode::~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&previous_); }

CudaStream::CudaStream(StreamPriority priority) {
  int least = 0, greatest = 0;  // numerically, greatest < least
  RA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const int level = priority == StreamPriority::kHigh          ? greatest
                    : priority == StreamPriority::kAboveNormal ? std::max(greatest, least - 1)
                                                                : least;
  RA_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, level));
}
CudaStream::~CudaStream() { (void)cudaStreamDestroy(stream_); }
void CudaStream::synchronize() const {
  refuse_under_capture("a wait for a stream");
  RA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

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
