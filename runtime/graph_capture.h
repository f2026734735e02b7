// A ringattn call captured into a CUDA graph (torch.cuda.graph, torch.compile's mode="reduce-overhead").
// A graph replays the captured kernels on the same addresses, long after the call returned, so memory a
// call keeps from call to call (grow-only scratch that a later, larger call reallocates) must not be in
// it: under a capture, such scratch becomes a temporary of the call, owned by the graph (CUDA's
// stream-ordered allocation turns it into the graph's own allocation node). Host-synchronous operations
// (a device allocation that outlives the call, a blocking copy, a wait for the device) cannot be captured
// and are refused by name instead of invalidating the capture inside CUDA.
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/tensor.h"

namespace ra {

// Whether work queued on `cuda_stream` (a cudaStream_t; nullptr: the legacy default stream) is being
// captured into a CUDA graph. False in a build without CUDA.
bool cuda_stream_capturing(void* cuda_stream);

// Brackets one captured call on this thread (SideStream opens one when its caller's stream is capturing):
// holds the call's scratch temporaries until it ends, then releases them in the order of their streams,
// after every kernel of the call queued there.
class CapturedCall {
 public:
  CapturedCall();
  ~CapturedCall();
  CapturedCall(const CapturedCall&) = delete;
  CapturedCall& operator=(const CapturedCall&) = delete;

  static CapturedCall* current();  // the innermost on this thread, or null
  void keep(Tensor temporary) { temporaries_.push_back(std::move(temporary)); }

 private:
  std::vector<Tensor> temporaries_;
  CapturedCall* enclosing_ = nullptr;
};

// `bytes` device bytes on `cuda_stream`, held by the current CapturedCall until it ends. Refused, naming
// `what`, where none is open (a C++ caller capturing without a SideStream).
TensorView captured_call_temporary(size_t bytes, void* cuda_stream, const char* what);

// A call's device scratch of at least `bytes` bytes, its contents undefined (callers fill what they read):
// `kept`, grown as reserve_scratch does and kept for the next call; where `cuda_stream` is being captured,
// a captured_call_temporary instead (`kept` untouched).
TensorView call_scratch(Tensor& kept, size_t bytes, void* cuda_stream, const char* what);

// Throws, naming the operation (for `what`, when given) and why, when this thread is inside a captured
// call: for what a CUDA graph cannot hold (host-synchronous operations, allocations that outlive the call).
void refuse_under_capture(const char* operation, const char* what = nullptr);

}  // namespace ra
