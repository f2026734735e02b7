// Named spans of device time on CUDA streams, for RingContext::time_steps: a begin and an end event
// recorded where the work is queued, read once the caller has waited. What the GPU ring's backward
// shows per step (compute, adds, transfers, the last hop) to say where its time goes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "attention/ring/ring.h"
#include "runtime/cuda_device.h"

namespace ra {

class DeviceSpans {
 public:
  void clear() { names_.clear(); }
  bool empty() const { return names_.empty(); }
  // Starts span `name` on `stream` and returns its index for end().
  int begin(std::string name, cudaStream_t stream);
  void end(int span, cudaStream_t stream) const;
  // Every span's start and end in ms after the first span's start (waits for the spans' last events).
  std::vector<DeviceSpan> read() const;

 private:
  std::vector<std::unique_ptr<CudaEvent>> events_;  // two per span, reused across calls
  std::vector<std::string> names_;
};

}  // namespace ra
