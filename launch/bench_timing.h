// Timing shared by the benchmarks: the median, a monotonic clock, a per-iteration timer (wall time on
// the host, CUDA events on the job's stream with --backend cuda) and the ring's statistics.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "attention/ring/ring.h"
#include "launch/commands.h"
#if RA_HAVE_CUDA
#include "attention/ring/ring_cuda.h"
#include "runtime/cuda_device.h"
#endif

namespace ra::cli {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Wall time on the host; with --backend cuda, CUDA events on the compute stream around the iteration
// (the GPU's own timeline, waits for the ring's transfers included).
class IterationTimer {
 public:
  explicit IterationTimer(const Job& job) : job_(job) {
#if RA_HAVE_CUDA
    if (job_.on_device) begin_ = std::make_unique<CudaEvent>(true), end_ = std::make_unique<CudaEvent>(true);
#endif
  }
  void start() {
#if RA_HAVE_CUDA
    if (job_.on_device) return begin_->record(static_cast<cudaStream_t>(job_.stream()));
#endif
    t0_ = now_seconds();
  }
  double stop_seconds() {
#if RA_HAVE_CUDA
    if (job_.on_device) {
      end_->record(static_cast<cudaStream_t>(job_.stream()));
      job_.synchronize();
      return end_->milliseconds_since(*begin_) * 1e-3;
    }
#endif
    return now_seconds() - t0_;
  }

 private:
  const Job& job_;
  double t0_ = 0;
#if RA_HAVE_CUDA
  std::unique_ptr<CudaEvent> begin_, end_;  // with --backend cuda only: a CPU run needs no GPU or driver
#endif
};

// The ring's statistics of its last call (nullptr for other implementations).
inline const RingStats* ring_stats(const AttentionImpl& impl) {
  if (const auto* ring = dynamic_cast<const RingAttention*>(&impl)) return &ring->last_stats();
#if RA_HAVE_CUDA
  if (const auto* ring = dynamic_cast<const RingAttentionCuda*>(&impl)) return &ring->last_stats();
#endif
  return nullptr;
}

}  // namespace ra::cli
