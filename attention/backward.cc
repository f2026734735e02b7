// The backward's per-call pieces on the host (delta, the sinks' gradient, the accumulators) and
// AttentionImpl::backward, the single-call convenience.
#include "attention/backward.h"

#include <cmath>
#include <utility>

#include "attention/attention_impl.h"
#include "attention/validate.h"
#include "runtime/error.h"
#include "runtime/memory.h"

#if RA_HAVE_CUDA
#include "attention/cuda/backward_cuda.h"
#endif

namespace ra {

GradAccumulators GradAccumulators::zeros(const AttentionInputs& in, MemoryKind memory, bool with_dbias) {
  GradAccumulators acc;
  acc.dq = Tensor(DType::kF32, in.q.shape(), memory);
  acc.dk = Tensor(DType::kF32, in.k.shape(), memory);
  acc.dv = Tensor(DType::kF32, in.v.shape(), memory);
  if (with_dbias && in.bias.defined()) acc.dbias = Tensor(DType::kF32, in.bias.shape(), memory);
  return acc;
}

GradAccumulators GradAccumulators::temporary(const AttentionInputs& in, MemoryKind memory, void* cuda_stream) {
  GradAccumulators acc;
  acc.dq = Tensor::temporary(DType::kF32, in.q.shape(), memory, cuda_stream);
  acc.dk = Tensor::temporary(DType::kF32, in.k.shape(), memory, cuda_stream);
  acc.dv = Tensor::temporary(DType::kF32, in.v.shape(), memory, cuda_stream);
  return acc;
}

bool bias_gradient_wanted(const AttentionInputs& in, const GradViews* into) {
  return in.bias.defined() && (into == nullptr || into->bias_gradient);
}

bool sinks_gradient_wanted(const AttentionInputs& in, const GradViews* into) {
  return in.sinks.defined() && (into == nullptr || into->sinks_gradient);
}

namespace {

// A bias's or the sinks' gradient given as an output (`out`): the call has that parameter (validated), asks
// for its gradient, and the view is f32, contiguous, shaped as the parameter, in q's memory.
void check_parameter_output(const TensorView& out, const char* name, const TensorView& parameter,
                            const char* parameter_name, bool wanted, const TensorView& q) {
  if (!out.defined()) return;
  RA_CHECK(parameter.defined(), "output ", name, " is given, but the call has no ", parameter_name);
  RA_CHECK(wanted, "output ", name, " is given, but the gradient of ", parameter_name, " is not asked for");
  check_output(out, name, parameter.shape(), q, /*q_dtype_or_f32=*/false);
}

// Where a bias's or the sinks' gradient is summed: a temporary of the call where it goes into the caller's
// view afterwards (a graph being captured can own it), else a tensor handed to the caller.
Tensor parameter_gradient(const Shape& shape, const TensorView& into, MemoryKind memory, void* stream) {
  return into.defined() ? Tensor::temporary(DType::kF32, shape, memory, stream) : Tensor(DType::kF32, shape, memory);
}

}  // namespace

TensorView dbias_over_pairs(const TensorView& dbias, const AttentionInputs& in, int64_t total_keys) {
  if (!dbias.defined()) return TensorView();
  return broadcast_to(dbias, Shape{in.q.dim(0), in.q.dim(2), in.q.dim(1), total_keys}, "dbias");
}

void check_dbias_deterministic(const TensorView& dbias_pairs, const AttentionParams& params) {
  if (!params.deterministic || !dbias_pairs.defined()) return;
  static const char* const kDims[] = {"batch", "head", "query", "key"};
  for (int i = 0; i < 4; ++i)
    RA_CHECK(dbias_pairs.stride(i) != 0 || dbias_pairs.dim(i) <= 1, "dbias: the bias is broadcast over its ", kDims[i],
             " dimension, whose gradient the cuda backward sums by atomics in no fixed order; deterministic on cuda "
             "needs a bias of full shape (B, H, T, S), or a host backward (host arrays: every sum in a fixed order)");
}

Tensor compute_delta(const TensorView& o, const TensorView& d_o, const TensorView& d_lse, void* cuda_stream,
                     const TensorView& zero) {
  const int64_t B = o.dim(0), T = o.dim(1), H = o.dim(2), Dv = o.dim(3);
  Tensor delta = Tensor::temporary(DType::kF32, {B, H, T}, o.memory(), cuda_stream);
  if (o.memory() == MemoryKind::kCuda) {
#if RA_HAVE_CUDA
    compute_delta_cuda(o, d_o, d_lse, delta, static_cast<cudaStream_t>(cuda_stream), zero);
#endif
    return delta;
  }
  if (zero.defined()) fill_zero_bytes(zero.data(), zero.nbytes(), zero.memory());
  const Tensor o32 = f32_copy(o), do32 = f32_copy(d_o);
  const float *po = o32.data<float>(), *pd = do32.data<float>();
  float* out = delta.data<float>();
  const Tensor dlse32 = d_lse.defined() ? f32_copy(d_lse) : Tensor();  // (B, H, T); f64 with f64 inputs
  const float* lse_gradient = d_lse.defined() ? dlse32.data<float>() : nullptr;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t row = ((b * T + t) * H + h) * Dv;
        float sum = 0;
        for (int64_t d = 0; d < Dv; ++d) sum += po[row + d] * pd[row + d];
        const int64_t r = (b * H + h) * T + t;
        out[r] = lse_gradient != nullptr ? sum - lse_gradient[r] : sum;
      }
  return delta;
}

void sinks_gradient_into(const TensorView& sinks, const TensorView& lse, const TensorView& delta,
                         const TensorView& dsinks, void* cuda_stream) {
  const int64_t B = lse.dim(0), H = lse.dim(1), T = lse.dim(2);
  if (lse.memory() == MemoryKind::kCuda) {
#if RA_HAVE_CUDA
    sinks_gradient_cuda(sinks, lse, delta, dsinks, static_cast<cudaStream_t>(cuda_stream));
#endif
    return;
  }
  const float *l = lse.data_as<float>(), *dl = delta.data_as<float>();
  for (int64_t h = 0; h < H; ++h) {
    const float sink = sinks.data_as<float>()[h * sinks.stride(0)];
    double sum = 0;  // B * T terms: summed in f64, stored in f32
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t r = (b * H + h) * T + t;
        if (l[r] != -INFINITY) sum -= std::exp(double(sink) - double(l[r])) * double(dl[r]);
      }
    dsinks.data_as<float>()[h] = float(sum);
  }
}

void convert_gradient(const TensorView& acc, const TensorView& out, void* cuda_stream) {
  if (acc.memory() == MemoryKind::kCuda) {
#if RA_HAVE_CUDA
    convert_f32_cuda(acc, out, static_cast<cudaStream_t>(cuda_stream));
#endif
    return;
  }
  convert_from_f32(acc.data_as<float>(), out.data(), out.dtype(), size_t(acc.numel()));
}

Tensor gradient_in_dtype(Tensor acc, DType dtype, void* cuda_stream) {
  if (dtype == DType::kF32 || !acc.defined()) return acc;
  Tensor out(dtype, acc.shape(), acc.view().memory());
  convert_gradient(acc, out, cuda_stream);
  return out;
}

void AttentionImpl::accumulate_backward(const AttentionInputs&, const TokenPositions&, const AttentionParams&,
                                        const BackwardInputs&, const GradViews&) const {
  RA_FAIL("attention implementation '", name(), "' on ", backend_name(backend()), " has no backward pass");
}

Gradients AttentionImpl::backward(const AttentionInputs& in, const AttentionParams& params, const TensorView& d_o,
                                  const AttentionOutput* forward_output, bool f32_gradients) const {
  return backward(in, params, TokenPositions::dense(in.q.dim(1), in.k.dim(1)), d_o, forward_output, f32_gradients);
}

Gradients AttentionImpl::backward(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                                  const TensorView& d_o, const AttentionOutput* forward_output, bool f32_gradients,
                                  const TensorView& d_lse) const {
  if (forward_output != nullptr)
    return backward(in, params, pos, d_o, ForwardViews{forward_output->o.view(), forward_output->lse.view()},
                    f32_gradients, nullptr, d_lse);
  const OneCallAtATime one_call(*this);
  check_alike([&] {
    validate_attention(in, params, pos, max_head_dim());
    check_flash_kernel_choice(*this, params);
    validate_backward(in, TensorView(), BackwardInputs{TensorView(), d_o, TensorView()}, /*need_lse=*/false);
  });
  // Our own forward keeps O in f32 for delta: an O rounded to bf16 would put its rounding into every
  // dS (visible in dbias and dsinks, which sum dS over rows).
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), Dv = in.v.dim(3);
  const MemoryKind memory = in.q.memory();
  const DType o_dtype = backward_reads_output() ? in.q.dtype() : DType::kF32;
  const AttentionOutput own{Tensor::temporary(o_dtype, {B, T, Hq, Dv}, memory, cuda_stream()),
                            Tensor::temporary(DType::kF32, {B, Hq, T}, memory, cuda_stream())};
  if (!forward_direct(in, params, pos, ForwardViews{own.o.view(), own.lse.view()})) {
    Carry carry = Carry::temporary(B, Hq, T, Dv, memory, cuda_stream());
    accumulate(in, pos, params, carry);
    finalize(carry, in.sinks, own.o, own.lse, cuda_stream());
  }
  return backward(in, params, pos, d_o, ForwardViews{own.o.view(), own.lse.view()}, f32_gradients, nullptr, d_lse);
}

Gradients AttentionImpl::backward(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                                  const TensorView& d_o, const ForwardViews& forward, bool f32_gradients,
                                  const GradViews* into, const TensorView& d_lse) const {
  const OneCallAtATime one_call(*this);
  const TensorView o = forward.o, lse = forward.lse;
  BackwardInputs grad{lse, d_o, TensorView(), o, d_lse};
  check_alike([&] {
    validate_attention(in, params, pos, max_head_dim());
    check_flash_kernel_choice(*this, params);
    validate_backward(in, o, grad);
    // An implementation reading O itself forms its own delta = rowsum(dO * O), which has no place for dLSE.
    RA_CHECK(!d_lse.defined() || !backward_reads_output(), "a gradient with respect to lse (dlse) is not supported "
             "by '", name(), "', whose backward forms rowsum(do * o) itself (cuDNN's); use flash_attn2 or sdpa");
    if (into != nullptr) {
      check_output(into->dq, "dq", in.q.shape(), in.q, true);
      check_output(into->dk, "dk", in.k.shape(), in.q, true);
      check_output(into->dv, "dv", in.v.shape(), in.q, true);
      check_parameter_output(into->dbias, "dbias", in.bias, "bias", into->bias_gradient, in.q);
      check_parameter_output(into->dsinks, "dsinks", in.sinks, "sinks", into->sinks_gradient, in.q);
      check_outputs_apart({{into->dq, "dq"}, {into->dk, "dk"}, {into->dv, "dv"}, {into->dbias, "dbias"},
                           {into->dsinks, "dsinks"}},
                          in, {{o, "o"}, {lse, "lse"}, {d_o, "do"}, {d_lse, "dlse"}});
    }
  });
  void* stream = cuda_stream();
  const MemoryKind memory = in.q.memory();
  const bool dsinks_wanted = sinks_gradient_wanted(in, into);
  // delta once per call: here where the sinks' gradient needs it whichever path runs (backward_into takes
  // it from grad), else by backward_into where it needs one (cudnn's computes its own) or below.
  Tensor delta;
  if (dsinks_wanted) grad.delta = delta = compute_delta(o, d_o, d_lse, stream);
  // The sinks' gradient, the ring's sums over its ranks, then dbias and dsinks into the caller's views.
  auto with_parameter_gradients = [&](Gradients& g) {
    if (dsinks_wanted) {
      g.dsinks = parameter_gradient(in.sinks.shape(), into ? into->dsinks : TensorView(), memory, stream);
      sinks_gradient_into(in.sinks, lse, delta, g.dsinks, stream);
    }
    reduce_sequence_gradients(g);  // the ring's dsinks: summed over its ranks
    if (into != nullptr)
      for (auto [view, gradient] : {std::pair{into->dbias, &g.dbias}, std::pair{into->dsinks, &g.dsinks}})
        if (view.defined()) {
          convert_gradient(*gradient, view, stream);
          *gradient = Tensor();  // written into the caller's view, not returned
        }
    return std::move(g);
  };
  Gradients direct;
  // The direct path writes q's dtype: into the caller's views where all three are in it, else into
  // tensors of its own.
  const bool into_q_dtype = into != nullptr && into->dq.dtype() == in.q.dtype() && into->dk.dtype() == in.q.dtype() &&
                            into->dv.dtype() == in.q.dtype();
  if (!f32_gradients && (into == nullptr || into_q_dtype) && backward_into(in, pos, params, grad, direct, into))
    return with_parameter_gradients(direct);
  if (!delta.defined()) grad.delta = delta = compute_delta(o, d_o, d_lse, stream);
  // f32 gradients without the caller's views are the accumulators themselves, handed to the caller:
  // those cannot be temporaries of this call's stream.
  const bool accumulators_returned = into == nullptr && f32_gradients;
  GradAccumulators acc = accumulators_returned ? GradAccumulators::zeros(in, memory, /*with_dbias=*/false)
                                               : GradAccumulators::temporary(in, memory, stream);
  if (bias_gradient_wanted(in, into))
    acc.dbias = parameter_gradient(in.bias.shape(), into ? into->dbias : TensorView(), memory, stream);
  GradViews views = acc.views();
  views.kv_unset = true;  // fresh zeros: a kernel may write dk / dv over instead of reading them back
  accumulate_backward(in, pos, params, grad, views);
  Gradients g;
  if (into != nullptr) {
    convert_gradient(acc.dq, into->dq, stream);
    convert_gradient(acc.dk, into->dk, stream);
    convert_gradient(acc.dv, into->dv, stream);
  } else {
    const DType dtype = f32_gradients ? DType::kF32 : in.q.dtype();
    g.dq = gradient_in_dtype(std::move(acc.dq), dtype, stream);
    g.dk = gradient_in_dtype(std::move(acc.dk), dtype, stream);
    g.dv = gradient_in_dtype(std::move(acc.dv), dtype, stream);
  }
  g.dbias = std::move(acc.dbias);
  return with_parameter_gradients(g);
}

}  // namespace ra
