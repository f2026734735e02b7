// Host side of the CUDA kernels' arguments.
#include "attention/cuda/cuda_inputs.h"

#include <algorithm>
#include <cstring>

#include "attention/attention_impl.h"
#include "runtime/cuda_device.h"
#include "runtime/graph_capture.h"
#include "runtime/memory.h"

namespace ra {
namespace {

DeviceView4 device_view(const TensorView& t, const char* name) {
  DeviceView4 out;
  if (!t.defined()) return out;
  RA_CHECK(t.memory() == MemoryKind::kCuda, name, " is in host memory; the cuda backend needs every tensor in "
           "device memory (copy it with ra::to_memory(view, MemoryKind::kCuda))");
  out.data = t.data();
  for (int i = 0; i < t.rank(); ++i) out.stride[i] = t.stride(i);
  return out;
}

}  // namespace

CudaAttentionArgs make_cuda_args(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& p,
                                 Carry& carry) {
  RA_CHECK(carry.numerator.view().memory() == MemoryKind::kCuda, "the carry is in host memory; the cuda backend "
           "needs Carry::empty(..., MemoryKind::kCuda)");
  CudaAttentionArgs a = make_cuda_args(in, pos, p);
  a.numerator = carry.numerator.data<float>();
  a.denominator = carry.denominator.data<float>();
  a.max = carry.max.data<float>();
  return a;
}

CudaAttentionArgs make_cuda_args(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& p) {
  CudaAttentionArgs a;
  a.q = device_view(in.q, "q");
  a.k = device_view(in.k, "k");
  a.v = device_view(in.v, "v");
  const Shape full{in.q.dim(0), in.q.dim(2), in.q.dim(1), pos.total_keys};
  if (in.bias.defined()) a.bias = device_view(broadcast_to(in.bias, full, "bias"), "bias");
  if (in.mask.defined()) a.mask = device_view(broadcast_to(in.mask, full, "mask"), "mask");
  a.mask_identity = in.mask.defined() ? in.mask_identity : 0;
  a.q_segment_ids = device_view(in.q_segment_ids, "q_segment_ids");
  a.kv_segment_ids = device_view(in.kv_segment_ids, "kv_segment_ids");
  a.pos = pos;
  a.batch = int(in.q.dim(0));
  a.q_len = int(in.q.dim(1));
  a.q_heads = int(in.q.dim(2));
  a.head_dim = int(in.q.dim(3));
  a.kv_len = int(in.k.dim(1));
  a.kv_heads = int(in.k.dim(2));
  a.value_dim = int(in.v.dim(3));
  a.scale = effective_scale(p, in.q.dim(3));
  a.soft_cap = p.logits_soft_cap;
  a.dropout_prob = p.dropout_prob;
  a.dropout_seed = p.dropout_seed;
  a.batch_offset = p.batch_offset;
  a.head_offset = p.head_offset;
  a.causal = p.causal;
  a.flash_kernel = p.flash_kernel;
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  return a;
}

DevicePositions DevicePositionBuffer::upload(const TokenPositions& pos, cudaStream_t stream) {
  const size_t count = pos.q.size() + pos.k.size(), bytes = count * sizeof(int64_t);
  if (cuda_stream_capturing(stream)) {
    const int64_t q_run = DevicePositions::run_of(pos.q), k_run = DevicePositions::run_of(pos.k);
    RA_CHECK((q_run != DevicePositions::kNotARun || pos.q.empty()) && (k_run != DevicePositions::kNotARun || pos.k.empty()),
             "token positions that are not one run each (a ring layout's) cannot be captured into a CUDA graph: "
             "a replay would read them from host memory again");
    auto* device = static_cast<int64_t*>(captured_call_temporary(bytes, stream, "token positions").data());
    fill_position_runs_cuda(device, int64_t(pos.q.size()), q_run, int64_t(pos.k.size()), k_run, stream);
    return describe(pos, device);
  }
  const bool same_as_last = copied_ && count == uploaded_count_ &&
                            std::memcmp(staging_.data<int64_t>(), pos.q.data(), pos.q.size() * sizeof(int64_t)) == 0 &&
                            std::memcmp(staging_.data<int64_t>() + pos.q.size(), pos.k.data(),
                                        pos.k.size() * sizeof(int64_t)) == 0;
  if (same_as_last) {
    // The device already holds these positions (calls of one shape repeat them): no copy, and no wait of the
    // host for the last one, which would keep the host from queueing more than a call ahead of the device.
    RA_CUDA_CHECK(cudaStreamWaitEvent(stream, copied_->get(), 0));
  } else {
    // The staging area may still be the source of the previous call's copy.
    if (copied_) RA_CUDA_CHECK(cudaEventSynchronize(copied_->get()));
    else copied_ = std::make_unique<CudaEvent>();
    reserve_scratch(device_, bytes, MemoryKind::kCuda, "token positions");
    reserve_scratch(staging_, bytes, MemoryKind::kPinned, "token positions (host staging)");
    auto* staged = staging_.data<int64_t>();
    std::memcpy(staged, pos.q.data(), pos.q.size() * sizeof(int64_t));
    std::memcpy(staged + pos.q.size(), pos.k.data(), pos.k.size() * sizeof(int64_t));
    RA_CUDA_CHECK(cudaMemcpyAsync(device_.data<int64_t>(), staged, bytes, cudaMemcpyHostToDevice, stream));
    copied_->record(stream);
    uploaded_count_ = count;
  }
  return describe(pos, device_.data<int64_t>());
}

DevicePositions DevicePositionBuffer::describe(const TokenPositions& pos, int64_t* device) {
  // A run is sorted: a single call's positions (runs) are scanned once, not again for their order.
  const int64_t q_run = DevicePositions::run_of(pos.q), k_run = DevicePositions::run_of(pos.k);
  const bool keys_sorted = k_run != DevicePositions::kNotARun || std::is_sorted(pos.k.begin(), pos.k.end());
  const bool queries_sorted = q_run != DevicePositions::kNotARun || std::is_sorted(pos.q.begin(), pos.q.end());
  DevicePositions uploaded{device,       device + pos.q.size(), pos.total_keys, keys_sorted,
                           pos.q.data(), pos.k.data(),          queries_sorted};
  uploaded.q_run = q_run, uploaded.k_run = k_run;
  return uploaded;
}

}  // namespace ra
