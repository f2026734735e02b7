#include "runtime/graph_capture.h"

#include <algorithm>
#include <utility>

#include "runtime/error.h"
#include "runtime/memory.h"

#if RA_HAVE_CUDA
#include "runtime/cuda_device.h"
#endif

namespace ra {
namespace {
thread_local CapturedCall* innermost_captured_call = nullptr;
}  // namespace

bool cuda_stream_capturing(void* cuda_stream) {
#if RA_HAVE_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  RA_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(cuda_stream), &status));
  return status != cudaStreamCaptureStatusNone;
#else
  (void)cuda_stream;
  return false;
#endif
}

CapturedCall::CapturedCall() : enclosing_(innermost_captured_call) { innermost_captured_call = this; }

CapturedCall::~CapturedCall() {
  temporaries_.clear();  // each released on its stream, behind the call's kernels
  innermost_captured_call = enclosing_;
}

CapturedCall* CapturedCall::current() { return innermost_captured_call; }

TensorView captured_call_temporary(size_t bytes, void* cuda_stream, const char* what) {
  CapturedCall* captured = CapturedCall::current();
  RA_CHECK(captured != nullptr, what, ": the stream is being captured into a CUDA graph, but not through a call "
           "that holds its temporaries (ra::SideStream): scratch kept between calls cannot be captured");
  Tensor temporary = Tensor::temporary(DType::kU8, {int64_t(std::max<size_t>(bytes, 1))}, MemoryKind::kCuda, cuda_stream);
  const TensorView view = temporary.view();
  captured->keep(std::move(temporary));
  return view;
}

TensorView call_scratch(Tensor& kept, size_t bytes, void* cuda_stream, const char* what) {
  if (CapturedCall::current() != nullptr || cuda_stream_capturing(cuda_stream))
    return captured_call_temporary(bytes, cuda_stream, what);
  reserve_scratch(kept, bytes, MemoryKind::kCuda, what);
  return kept.view();
}

void refuse_under_capture(const char* operation, const char* what) {
  if (CapturedCall::current() == nullptr) return;
  RA_FAIL(operation, what ? " for " : "", what ? what : "", " cannot be captured into a CUDA graph (a graph holds "
          "only stream-ordered work and the call's own temporaries); run this call outside the capture");
}

}  // namespace ra
