// A call captured into a CUDA graph (runtime/graph_capture.h): its scratch is a temporary the graph owns,
// not the buffer kept between calls; what a graph cannot hold is refused by name and leaves the capture
// valid; a capture not bracketed by a SideStream refuses kept scratch by name. Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "runtime/cuda_device.h"
#include "runtime/graph_capture.h"
#include "runtime/memory.h"

namespace ra::test {
namespace {

template <typename Fn>
std::string refusal_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(GraphCapture, ACapturedCallsScratchIsTheGraphsAndReplaysIntoTheSameBytes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const CudaStream caller;
  Tensor kept;
  reserve_scratch(kept, 64, MemoryKind::kCuda, "the kept scratch");
  const void* kept_bytes = kept.data<char>();
  Tensor result(DType::kU8, {256}, MemoryKind::kCuda);  // made before the capture: the graph writes it
  cudaGraph_t graph = nullptr;
  RA_CUDA_CHECK(cudaStreamBeginCapture(caller.get(), cudaStreamCaptureModeGlobal));
  {
    const SideStream side(caller.get());
    ASSERT_TRUE(side.captured());
    const TensorView scratch = call_scratch(kept, 4096, side.get(), "the test's scratch");
    EXPECT_EQ(kept.data<char>(), kept_bytes);  // not regrown: the graph never sees it
    EXPECT_NE(scratch.data(), kept_bytes);
    RA_CUDA_CHECK(cudaMemsetAsync(scratch.data(), 7, 4096, static_cast<cudaStream_t>(side.get())));
    RA_CUDA_CHECK(cudaMemcpyAsync(result.data<char>(), scratch.data(), 256, cudaMemcpyDeviceToDevice,
                                  static_cast<cudaStream_t>(side.get())));
    const std::string refusal = refusal_of([] { Tensor(DType::kF32, {4}, MemoryKind::kCuda); });
    EXPECT_NE(refusal.find("device memory that outlives the call for an f32 tensor of shape"), std::string::npos);
    EXPECT_NE(refusal.find("cannot be captured into a CUDA graph"), std::string::npos) << refusal;
  }
  RA_CUDA_CHECK(cudaStreamEndCapture(caller.get(), &graph));  // still valid after the refusal
  cudaGraphExec_t exec = nullptr;
  RA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    RA_CUDA_CHECK(cudaMemsetAsync(result.data<char>(), 0, 256, caller.get()));
    RA_CUDA_CHECK(cudaGraphLaunch(exec, caller.get()));
    caller.synchronize();
    std::vector<unsigned char> host(256);
    cuda_copy(host.data(), result.data<char>(), 256);
    EXPECT_EQ(host, std::vector<unsigned char>(256, 7)) << "replay " << replay;
  }
  RA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  RA_CUDA_CHECK(cudaGraphDestroy(graph));
}

TEST(GraphCapture, KeptScratchOfACaptureWithoutASideStreamIsRefusedByName) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const CudaStream caller;
  Tensor kept;
  RA_CUDA_CHECK(cudaStreamBeginCapture(caller.get(), cudaStreamCaptureModeGlobal));
  const std::string refusal = refusal_of([&] { call_scratch(kept, 4096, caller.get(), "the test's scratch"); });
  cudaGraph_t graph = nullptr;
  RA_CUDA_CHECK(cudaStreamEndCapture(caller.get(), &graph));
  RA_CUDA_CHECK(cudaGraphDestroy(graph));
  EXPECT_NE(refusal.find("the test's scratch: the stream is being captured into a CUDA graph, but not through a call"),
            std::string::npos)
      << refusal;
  EXPECT_FALSE(kept.defined());
  EXPECT_FALSE(cuda_stream_capturing(caller.get()));
}

}  // namespace
}  // namespace ra::test
