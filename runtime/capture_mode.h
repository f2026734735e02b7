// Set-up made lazily (a stream, an event, a memory pool) may first be needed while a caller's stream is being
// captured into a CUDA graph, whose global mode (PyTorch's) forbids such calls on every thread then. Used only
// by the runtime's own .cc files (CUDA builds).
#pragma once

#include <cuda_runtime_api.h>

namespace ra {

// This thread's stream-capture mode relaxed while it lives: for set-up that queues nothing.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode();
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace ra
