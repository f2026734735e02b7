// The base of the CUDA implementations: work runs on one stream (the caller's, or the legacy default
// stream), and a second entry point takes token positions already on the device, which the GPU ring
// uses to avoid a host round trip per step.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/attention_impl.h"
#include "attention/cuda/cuda_inputs.h"
#include "runtime/cuda_device.h"

namespace ra {

class CudaAttentionImpl : public AttentionImpl {
 public:
  CudaAttentionImpl() { check_cuda_kernels_runnable(); }  // a compile-check build's kernels never run
  Backend backend() const override { return Backend::kCuda; }
  void set_cuda_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  void* cuda_stream() const override { return stream_; }

  // Uploads the positions, then accumulate_device.
  void accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                  Carry& carry) const override;

  // Throws (naming the tensor, the dimension and an implementation that can) when these inputs are
  // beyond this kernel; cheap, host-only, and called before any device work.
  virtual void check_supported(const AttentionInputs& in, const AttentionParams& params) const {}
  virtual void accumulate_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& params,
                                 Carry& carry) const = 0;

  // The backward the same way: check_backward_supported, positions uploaded, accumulate_backward_device.
  void accumulate_backward(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                           const BackwardInputs& grad, const GradViews& acc) const override;
  virtual void check_backward_supported(const AttentionInputs& in, const AttentionParams& params) const {
    check_supported(in, params);
  }
  virtual void accumulate_backward_device(const AttentionInputs& in, const DevicePositions& pos,
                                          const AttentionParams& params, const BackwardInputs& grad,
                                          const GradViews& acc) const {}

  // Whether two calls of accumulate_backward_device may run at once on two streams (they share no buffer
  // and add dQ by atomics in no fixed order): the GPU ring's backward then overlaps one launch's last wave
  // with the next's first.
  virtual bool independent_backward_calls(const AttentionParams& params) const { return false; }
  // Whether a call already running gives way to one queued later on a stream of higher priority (its
  // blocks are short, so the other stream's take the SMs as they free): the GPU ring's backward then
  // runs its own block whole beside the other ranks' blocks and still sees those finish first.
  virtual bool backward_yields_to_priority() const { return true; }
  // Whether accumulate_backward_device honours GradViews::kv_unset (writes every row of dk and dv): the GPU
  // ring then leaves its step's dK / dV partial unzeroed, and the call reads no accumulator it writes first.
  virtual bool writes_unset_kv() const { return false; }

  // The positions of a call on the device: uploaded here; the ring adds every rank's keys.
  virtual DevicePositions device_positions(const TokenPositions& pos) const { return positions_.upload(pos, stream_); }

  // Set by the ring before each block: whether the kernel queued on the stream just before the next
  // accumulate_device writes nothing that call reads but the carry (CudaAttentionArgs::after_carry_writer).
  void set_after_carry_writer(bool value) { after_carry_writer_ = value; }

 protected:
  // Where backward_into writes: the caller's views `into`, else new device tensors in q's dtype held by `out`.
  static GradViews gradients_in_q_dtype(const AttentionInputs& in, Gradients& out, const GradViews* into);
  // Whether backward_into's kernels can write the caller's views themselves: none given, or dq, dk and dv at
  // 16-byte aligned addresses (the wgmma kernels store dK and dV by the TMA unit, cuDNN reads and writes 16 bytes
  // at a time, the mma.sync kernel writes pairs). Else the accumulators' path converts into them.
  static bool writes_into_views(const GradViews* into);

  cudaStream_t stream_ = nullptr;
  bool after_carry_writer_ = false;
  mutable DevicePositionBuffer positions_;
};

}  // namespace ra
