// AttentionImpl: one attention implementation on one backend, as in the seeds. Every implementation
// folds a query block against one K/V block into the f32 carry (`accumulate`), which is what lets
// `ring` call any local kernel once per step; `forward` is the single-call convenience on top. The
// backward mirrors it: `accumulate_backward` per K/V block, `backward` for a single call.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "attention/backward.h"
#include "attention/carry.h"
#include "attention/inputs.h"
#include "attention/params.h"

namespace ra {

enum class Backend : uint8_t { kCpu, kCuda, kNative };
std::string_view backend_name(Backend backend);
Backend parse_backend(std::string_view name);  // "cpu" | "cuda" | "native"

struct AttentionOutput {
  Tensor o;    // (B, T, Hq, Dv) in q's dtype, in q's memory (host or device)
  Tensor lse;  // (B, Hq, T) f32, natural log; -inf for rows that see no key
};

// A forward's O and LSE as views the caller keeps (a framework's arrays): what the backward reads of a
// forward it did not run itself, without a copy.
struct ForwardViews {
  TensorView o, lse;
};

// An implementation object keeps state between calls (device buffers, built graphs, a ring's channel and
// last statistics), so it serves one call at a time: the single-call entry points (forward, forward_into,
// backward) refuse, naming the implementation, a call from another thread while one runs, instead of
// racing on that state. Make one object per thread (the Python layer keeps one per thread and device).
class AttentionImpl {
 public:
  virtual ~AttentionImpl() = default;
  virtual std::string_view name() const = 0;
  virtual Backend backend() const = 0;
  virtual int64_t max_head_dim() const { return 256; }

  // The CUDA stream (a cudaStream_t) device work is queued on; nullptr is the legacy default stream.
  // Host implementations ignore it.
  virtual void set_cuda_stream(void* stream) {}
  virtual void* cuda_stream() const { return nullptr; }
  // Whether AttentionParams::flash_kernel chooses this implementation's kernels (CUDA flash_attn2, and the
  // GPU ring over it); every other implementation refuses a forced kernel (check_flash_kernel_choice).
  virtual bool takes_flash_kernel() const { return false; }

  // carry (B, Hq, T, Dv) <- carry (+) attention of in.q against in.k / in.v. Validated inputs.
  virtual void accumulate(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                          Carry& carry) const = 0;

  // Validates, runs one accumulate from an empty carry and finalizes O and LSE (in q's memory; on a
  // device the result is ready once cuda_stream() has reached this point).
  AttentionOutput forward(const AttentionInputs& in, const AttentionParams& params) const;
  AttentionOutput forward(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos) const;
  // The same into the caller's o (q's dtype, or f32) and lse (f32), both contiguous in q's memory: no
  // allocation for the results (a framework's allocator made them).
  void forward_into(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                    const ForwardViews& out) const;

  // Where an implementation writes a single call's O and LSE itself, without a carry (the wgmma flash
  // forward): true when it did; false: forward_into runs accumulate and finalize. Validated inputs.
  virtual bool forward_direct(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                              const ForwardViews& out) const {
    return false;
  }

  // The backward of `accumulate` (attention/backward.h): dq, dk, dv (and dbias) of this K/V block added
  // into f32 accumulators the caller holds. Validated inputs. Implementations without a backward throw.
  virtual bool has_backward() const { return false; }
  virtual void accumulate_backward(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                                   const BackwardInputs& grad, const GradViews& acc) const;

  // Where an implementation can do better than accumulate_backward for a whole call: its backward reads O
  // itself (cudnn: our own forward keeps O in q's dtype for it), and it writes the gradients in q's
  // dtype directly (true; false: the f32-accumulator path runs): into `into` where given (views in q's dtype,
  // contiguous: a framework's tensors), else into tensors of its own in `out`; grad.delta where given (sinks).
  virtual bool backward_reads_output() const { return false; }
  virtual bool backward_into(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                             const BackwardInputs& grad, Gradients& out, const GradViews* into) const {
    return false;
  }

  // Validates, runs the forward unless its output is given (then keeping O in f32 for delta), computes
  // delta, one accumulate_backward and returns the gradients in q's dtype (f32 with f32_gradients) and
  // dbias / dsinks in f32.
  Gradients backward(const AttentionInputs& in, const AttentionParams& params, const TensorView& d_o,
                     const AttentionOutput* forward_output = nullptr, bool f32_gradients = false) const;
  // The same at given positions (the ring's: ring_positions); d_lse as below.
  Gradients backward(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                     const TensorView& d_o, const AttentionOutput* forward_output = nullptr,
                     bool f32_gradients = false, const TensorView& d_lse = TensorView()) const;
  // The same from the forward's O and LSE as views (both defined). With `into`, dq, dk and dv are
  // written there (each view's dtype: q's or f32; contiguous, in q's memory) instead of returned; dbias
  // and dsinks are still returned. d_lse (optional, (B, Hq, T) f32): the loss's gradient with respect to
  // LSE, where the loss reads it too (BackwardInputs::d_lse); refused where backward_reads_output().
  Gradients backward(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                     const TensorView& d_o, const ForwardViews& forward, bool f32_gradients = false,
                     const GradViews* into = nullptr, const TensorView& d_lse = TensorView()) const;
  // Sums what a sequence-parallel backward computes per rank but owns jointly (dsinks; dbias of a bias
  // broadcast over the query rows) over the sequence axis; local implementations have nothing to sum.
  virtual void reduce_sequence_gradients(Gradients& g) const {}

  // A check of a call's arguments failed on this rank (`refused`: its error). Where the call's ranks run it
  // together (the rings), this rank joins their agreement to start with that error, so that every rank stops
  // at once naming it (collectives/call_agreement.h), and the caller then raises it. A local implementation
  // has no one to tell.
  virtual void refuse_call(const std::exception_ptr& refused) const {}

 protected:
  // Runs a call's checks of its arguments; where they throw, refuse_call first.
  template <typename Checks>
  void check_alike(Checks&& checks) const {
    try {
      checks();
    } catch (...) {
      refuse_call(std::current_exception());
      throw;
    }
  }

 private:
  class OneCallAtATime;  // held by the single-call entry points
  mutable std::atomic<std::thread::id> caller_{};  // the thread inside a single-call entry point, if any
};

// Marks the impl as inside a call of this thread (calls nest: backward runs the forward) and refuses
// another thread's call meanwhile.
class AttentionImpl::OneCallAtATime {
 public:
  explicit OneCallAtATime(const AttentionImpl& impl) : impl_(impl) {
    const std::thread::id me = std::this_thread::get_id();
    if (impl.caller_.load() == me) return;  // nested in this thread's own call
    std::thread::id none;
    if (!impl.caller_.compare_exchange_strong(none, me)) refuse(impl);
    owner_ = true;
  }
  ~OneCallAtATime() {
    if (owner_) impl_.caller_.store(std::thread::id());
  }
  OneCallAtATime(const OneCallAtATime&) = delete;
  OneCallAtATime& operator=(const OneCallAtATime&) = delete;

 private:
  [[noreturn]] static void refuse(const AttentionImpl& impl);  // throws, naming impl
  const AttentionImpl& impl_;
  bool owner_ = false;
};

// Throws, naming the implementation, when params force a flash kernel that `impl` does not run: a choice
// never ignored silently. The single-call entry points (forward, forward_into, backward) check it.
void check_flash_kernel_choice(const AttentionImpl& impl, const AttentionParams& params);

}  // namespace ra
