// The CUDA runtime as ringattn uses it: checked calls, device selection, device memory, and RAII
// streams (with a priority), events and pinned host memory. Included only by code built when CUDA is on.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

#include "runtime/error.h"

// RA_CUDA_CHECK(call): throws ra::Error with the call, the CUDA error name and its description.
#define RA_CUDA_CHECK(call)                                                                          \
  do {                                                                                               \
    cudaError_t ra_status_ = (call);                                                                 \
    if (ra_status_ != cudaSuccess)                                                                   \
      RA_FAIL(#call, " failed: ", cudaGetErrorName(ra_status_), " (", cudaGetErrorString(ra_status_), ")"); \
  } while (0)

namespace ra {

// Number of usable CUDA devices; 0 when there is no driver or no device (never throws).
int cuda_device_count();

// Binds this process to device local_rank % count (one rank per GPU) and returns it.
int cuda_select_device(int local_rank);

// Throws where a GPU is visible but this build's device code was compiled only to check that it builds
// (CMake's RA_CUDA_COMPILE_CHECK, unoptimised): nothing runs such kernels. Every CUDA implementation's
// constructor and cuda_select_device call it.
void check_cuda_kernels_runnable();

void* cuda_allocate(size_t bytes, const char* what);  // throws naming bytes asked and bytes free
void cuda_release(void* p);
void cuda_memset_zero(void* p, size_t bytes);
void cuda_copy(void* dst, const void* src, size_t bytes);  // any direction, synchronous
// Bytes in use on the current device (total minus free): every process's allocations, the CUDA
// context and NCCL's buffers included.
size_t cuda_bytes_in_use();
size_t cuda_bytes_free();
// The high-water mark of the device bytes ringattn itself has allocated (cuda_allocate) since the last
// reset: a call's peak, without the CUDA context or libraries' private pools.
size_t cuda_allocated_peak_bytes();
void cuda_reset_allocated_peak();  // on the current device, for the up-front fit check
// Page-locked host memory (MemoryKind::kPinned): host <-> device copies from it are DMA at full speed.
void* cuda_allocate_pinned(size_t bytes, const char* what);
void cuda_release_pinned(void* p);

// ringattn's cache for the device memory of a call's temporaries (carries, f32 accumulators, delta):
// one stream-ordered pool per device whose freed blocks are kept for the next call instead of going
// back to the driver, so a call neither maps fresh memory nor waits for the device. Allocation, zero
// fill and release are queued on `stream`; a block released there is reused by later work of any
// stream only once that work is ordered after the release (CUDA's pool tracks it). Counted in
// cuda_allocated_peak_bytes. A failed allocation, here or by cuda_allocate, first hands the cache back.
void* cuda_allocate_temporary(size_t bytes, cudaStream_t stream, const char* what);
void cuda_release_temporary(void* p, cudaStream_t stream);
void cuda_memset_zero_async(void* p, size_t bytes, cudaStream_t stream);
// Bytes the caches of this process's devices hold for reuse (none in use).
size_t cuda_cached_bytes();
// Waits for each device with a cache, then gives every cached byte back to the driver (for other
// libraries' allocators, e.g. PyTorch's, which cannot see this cache).
void cuda_release_cached();
// The most bytes each device's cache keeps once the device has been waited for (default: no bound, i.e.
// the largest call's temporaries stay); above it, the excess goes back to the driver at such waits.
void cuda_set_cache_limit(size_t bytes);

// kHigh: the device's greatest stream priority. Blocks of a high-priority stream are dispatched
// before waiting blocks of lower ones, so a transfer queued while a long kernel occupies every SM starts
// as SMs free up instead of after the kernel's last block. kAboveNormal: one step above the least, for
// work that should go before the compute stream's but after the transfers' (the greatest where the
// device has only two levels).
enum class StreamPriority { kNormal, kAboveNormal, kHigh };

class CudaStream {
 public:
  // Non-blocking with respect to the legacy default stream.
  explicit CudaStream(StreamPriority priority = StreamPriority::kNormal);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  explicit CudaEvent(bool timing = false);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream) const;
  float milliseconds_since(const CudaEvent& start) const;  // both recorded, this one complete

 private:
  cudaEvent_t event_ = nullptr;
};

// Waits on the host for `event` with a deadline, polling it every 20 us (a blocking synchronisation
// could hang forever on a dead peer) and calling `between_polls` after each query that found it
// unfinished (it may throw, e.g. on a communicator's asynchronous error). Returns cudaSuccess, the
// error the event reported, or cudaErrorTimeout once `timeout` has passed; the caller names the wait.
cudaError_t poll_event(cudaEvent_t event, std::chrono::milliseconds timeout,
                       const std::function<void()>& between_polls = {});

}  // namespace ra
