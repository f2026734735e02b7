// Boundary validation of attention inputs, and the f32 view the CPU kernels read.
#include "attention/validate.h"

#include <cmath>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <utility>

#include "attention/backward.h"
#include "runtime/error.h"

namespace ra {
namespace {

void check_float(const TensorView& t, const char* name, bool f64) {
  if (f64 && t.dtype() == DType::kF64) return;
  RA_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF16 || t.dtype() == DType::kBF16, name, " has dtype ",
           dtype_name(t.dtype()), ", expected f32, f16 or bf16",
           t.dtype() == DType::kF64 ? " (f64 inputs: impl sdpa on the host, the f64 reference)" : "");
}

void check_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  RA_CHECK(t.rank() == rank, name, " has rank ", t.rank(), " (shape ", t.shape().str(), "), expected ", rank, " ",
           layout);
}

void check_dim(const TensorView& t, const char* name, int dim, const char* dim_name, int64_t expected,
               const char* what) {
  RA_CHECK(t.dim(dim) == expected, name, " dimension ", dim, " (", dim_name, ") is ", t.dim(dim), ", expected ",
           expected, " ", what, " (shape ", t.shape().str(), ")");
}

// Element i of a float buffer of any dtype, in T.
template <typename T>
T load_as(const void* data, DType dtype, size_t i) {
  if (dtype == DType::kF64) return T(static_cast<const double*>(data)[i]);
  return T(load_as_f32(data, dtype, i));
}

template <typename T>
Tensor float_copy(const TensorView& t) {
  Tensor out(std::is_same_v<T, double> ? DType::kF64 : DType::kF32, t.shape());
  T* dst = out.data<T>();
  const size_t elem = dtype_size(t.dtype());
  // Walked as a 4-d view: dimensions below the tensor's rank lead, of size 1.
  const int pad = kMaxRank - t.rank();
  int64_t dim[kMaxRank], stride[kMaxRank];
  for (int i = 0; i < kMaxRank; ++i) {
    dim[i] = i < pad ? 1 : t.dim(i - pad);
    stride[i] = i < pad ? 0 : t.stride(i - pad);
  }
  int64_t n = 0;
  for (int64_t a = 0; a < dim[0]; ++a)
    for (int64_t b = 0; b < dim[1]; ++b)
      for (int64_t c = 0; c < dim[2]; ++c) {
        const char* row = static_cast<const char*>(t.data()) + (a * stride[0] + b * stride[1] + c * stride[2]) * int64_t(elem);
        for (int64_t d = 0; d < dim[3]; ++d) dst[n++] = load_as<T>(row, t.dtype(), size_t(d * stride[3]));
      }
  return out;
}

}  // namespace

Tensor f32_copy(const TensorView& t) { return float_copy<float>(t); }
Tensor f64_copy(const TensorView& t) { return float_copy<double>(t); }

void validate_attention(const AttentionInputs& in, const AttentionParams& p, const TokenPositions& pos,
                        int64_t max_head_dim, bool f64) {
  RA_CHECK(in.q.defined() && in.k.defined() && in.v.defined(), "q, k and v are all required");
  check_rank(in.q, "q", 4, "(batch, q_len, q_heads, head_dim)");
  check_rank(in.k, "k", 4, "(batch, kv_len, kv_heads, head_dim)");
  check_rank(in.v, "v", 4, "(batch, kv_len, kv_heads, v_head_dim)");
  check_float(in.q, "q", f64);
  check_float(in.k, "k", f64);
  check_float(in.v, "v", f64);
  RA_CHECK(in.k.dtype() == in.q.dtype() && in.v.dtype() == in.q.dtype(), "q, k and v must share a dtype: q is ",
           dtype_name(in.q.dtype()), ", k ", dtype_name(in.k.dtype()), ", v ", dtype_name(in.v.dtype()));
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), D = in.q.dim(3);
  const int64_t S = in.k.dim(1), Hkv = in.k.dim(2), Dv = in.v.dim(3);
  check_dim(in.k, "k", 0, "batch", B, "(q's batch)");
  check_dim(in.v, "v", 0, "batch", B, "(q's batch)");
  check_dim(in.k, "k", 3, "head_dim", D, "(q's head_dim)");
  check_dim(in.v, "v", 1, "kv_len", S, "(k's kv_len)");
  check_dim(in.v, "v", 2, "kv_heads", Hkv, "(k's kv_heads)");
  RA_CHECK(Hkv > 0 && Hq % Hkv == 0, "q dimension 2 (q_heads) is ", Hq,
           ", expected a multiple of k dimension 2 (kv_heads) = ", Hkv, " for GQA/MQA");
  // (sdpa takes any head dim: say so where this implementation stops.)
  const char* elsewhere = max_head_dim < kAnyHeadDim ? " here; sdpa takes any (--impl sdpa, or --local-impl sdpa in the ring)" : "";
  RA_CHECK(D >= 1 && D <= max_head_dim, "q dimension 3 (head_dim) is ", D, ": unsupported head dim, expected 1 to ",
           max_head_dim, elsewhere);
  RA_CHECK(Dv >= 1 && Dv <= max_head_dim, "v dimension 3 (v_head_dim) is ", Dv, ": unsupported head dim, expected 1 to ",
           max_head_dim, elsewhere);
  for (const auto* t : {&in.q, &in.k, &in.v})
    RA_CHECK(t->memory() == MemoryKind::kHost || t->memory() == in.q.memory(), "q, k and v must share a memory kind");
  RA_CHECK(int64_t(pos.q.size()) == T, "query positions: ", pos.q.size(), " given, expected q_len = ", T);
  RA_CHECK(int64_t(pos.k.size()) == S, "key positions: ", pos.k.size(), " given, expected kv_len = ", S);
  const Shape full{B, Hq, T, pos.total_keys};
  if (in.bias.defined()) {
    RA_CHECK(in.bias.dtype() == DType::kF32 || (f64 && in.bias.dtype() == DType::kF64), "bias has dtype ",
             dtype_name(in.bias.dtype()), ", expected f32", f64 ? " or f64" : "");
    broadcast_to(in.bias, full, "bias");
  }
  if (in.mask.defined()) {
    RA_CHECK(in.mask.dtype() == DType::kU8, "mask has dtype ", dtype_name(in.mask.dtype()), ", expected bool/u8",
             in.mask.dtype() == DType::kI32 ? "" : " (a float mask that is added to the logits, 0 where seen and -inf "
             "where hidden as PyTorch's attn_mask, is a bias: pass it as the bias)");
    broadcast_to(in.mask, full, "mask");
  }
  if (in.sinks.defined()) {
    RA_CHECK((in.sinks.dtype() == DType::kF32 || (f64 && in.sinks.dtype() == DType::kF64)) && in.sinks.rank() == 1 &&
                 in.sinks.dim(0) == Hq,
             "sinks has shape ", in.sinks.shape().str(), " and dtype ", dtype_name(in.sinks.dtype()), ", expected f32",
             f64 ? " or f64" : "", " (", Hq, ") (one logit per query head)");
  }
  RA_CHECK(in.q_segment_ids.defined() == in.kv_segment_ids.defined(),
           "segment ids need both segment_ids (B, T) and kv_segment_ids (B, S)");
  if (in.q_segment_ids.defined()) {  // named as the CLI's datasets and Python's options name them
    for (auto [t, name, len] : {std::tuple{&in.q_segment_ids, "segment_ids", T},
                                std::tuple{&in.kv_segment_ids, "kv_segment_ids", S}}) {
      RA_CHECK(t->dtype() == DType::kI32, name, " has dtype ", dtype_name(t->dtype()), ", expected i32");
      check_rank(*t, name, 2, "(batch, len)");
      check_dim(*t, name, 0, "batch", B, "(q's batch)");
      check_dim(*t, name, 1, "len", len, "(the sequence length)");
    }
  }
  RA_CHECK(p.window_left >= -1 && p.window_right >= -1, "sliding window (", p.window_left, ", ", p.window_right,
           ") has a negative size: expected sizes >= 0, or -1 for unbounded");
  RA_CHECK(std::isfinite(p.softmax_scale) && p.softmax_scale >= 0.0f, "scale (softmax_scale) is ", p.softmax_scale,
           ", expected a finite value > 0 (or 0 for 1/sqrt(head_dim))");
  RA_CHECK(std::isfinite(p.logits_soft_cap) && p.logits_soft_cap >= 0.0f, "softcap (logits_soft_cap) is ",
           p.logits_soft_cap, ", expected >= 0 (0 is off)");
  RA_CHECK(p.dropout_prob >= 0.0f && p.dropout_prob < 1.0f, "dropout_prob is ", p.dropout_prob,
           ", expected 0 <= p < 1");
  RA_CHECK(p.block_q >= 1 && p.block_k >= 1, "block sizes (", p.block_q, ", ", p.block_k, ") must be >= 1");
}

namespace {

// What a tensor that may be in q's dtype or f32 may be: "q's bf16 or f32", or "f32" where q is f32.
std::string q_dtype_or_f32_text(const TensorView& q) {
  return q.dtype() == DType::kF32 ? std::string("f32") : "q's " + std::string(dtype_name(q.dtype())) + " or f32";
}

}  // namespace

void check_output(const TensorView& out, const char* name, const Shape& shape, const TensorView& q,
                  bool q_dtype_or_f32) {
  RA_CHECK(out.defined(), "output ", name, " is missing, expected ", shape.str());
  RA_CHECK(out.shape() == shape, "output ", name, " has shape ", out.shape().str(), ", expected ", shape.str());
  RA_CHECK(out.dtype() == DType::kF32 || (q_dtype_or_f32 && out.dtype() == q.dtype()), "output ", name, " has dtype ",
           dtype_name(out.dtype()), ", expected ", q_dtype_or_f32 ? q_dtype_or_f32_text(q) : "f32");
  RA_CHECK(out.is_contiguous(), "output ", name, " is not contiguous");
  RA_CHECK(out.memory() == q.memory(), "output ", name, " must be in q's memory (host or device)");
}

void check_outputs_apart(std::initializer_list<NamedView> outputs, const AttentionInputs& in,
                         std::initializer_list<NamedView> reads) {
  const NamedView inputs[] = {{in.q, "q"},       {in.k, "k"},         {in.v, "v"},
                              {in.bias, "bias"}, {in.mask, "mask"},   {in.sinks, "sinks"},
                              {in.q_segment_ids, "segment_ids"}, {in.kv_segment_ids, "kv_segment_ids"}};
  auto refuse_meeting = [](const NamedView& out, const NamedView& other, const char* what) {
    RA_CHECK(!spans_meet(out.view, other.view), "output ", out.name, " shares memory with ", what, other.name,
             ": outputs need memory of their own (the call still reads its inputs while it writes its outputs)");
  };
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (const NamedView& read : inputs) refuse_meeting(*out, read, "input ");
    for (const NamedView& read : reads) refuse_meeting(*out, read, "input ");
    for (auto other = outputs.begin(); other != out; ++other) refuse_meeting(*out, *other, "output ");
  }
}

void validate_backward(const AttentionInputs& in, const TensorView& o, const BackwardInputs& grad, bool need_lse) {
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), Dv = in.v.dim(3);
  RA_CHECK(grad.d_o.defined(), "do (the gradient of o) is required for the backward pass, expected (", B, ", ", T,
           ", ", Hq, ", ", Dv, ")");
  check_rank(grad.d_o, "do", 4, "(batch, q_len, q_heads, v_head_dim)");
  check_dim(grad.d_o, "do", 0, "batch", B, "(q's batch)");
  check_dim(grad.d_o, "do", 1, "q_len", T, "(q's q_len)");
  check_dim(grad.d_o, "do", 2, "q_heads", Hq, "(q's q_heads)");
  check_dim(grad.d_o, "do", 3, "v_head_dim", Dv, "(v's v_head_dim)");
  const std::string q_dtype_or_f32 = q_dtype_or_f32_text(in.q);
  RA_CHECK(grad.d_o.dtype() == in.q.dtype() || grad.d_o.dtype() == DType::kF32, "do has dtype ",
           dtype_name(grad.d_o.dtype()), ", expected ", q_dtype_or_f32);
  RA_CHECK(grad.d_o.memory() == in.q.memory(), "do must be in q's memory (host or device)");
  for (auto [t, name] :
       {std::pair{&grad.lse, "lse"}, std::pair{&grad.delta, "delta"}, std::pair{&grad.d_lse, "dlse"}}) {
    const bool is_lse = std::string_view(name) == "lse";
    if (!t->defined() && (!is_lse || !need_lse)) continue;  // delta: computed from o and do; dlse: optional
    RA_CHECK(t->defined(), "lse (the forward's log-sum-exp) is required for the backward pass, expected f32 (", B,
             ", ", Hq, ", ", T, ")");
    // f64 inputs (the f64 reference's) come with the reference's f64 LSE.
    const bool f64 = in.q.dtype() == DType::kF64;
    RA_CHECK((t->dtype() == DType::kF32 || (f64 && t->dtype() == DType::kF64)) && t->rank() == 3 && t->is_contiguous(),
             name, " has shape ", t->shape().str(), " and dtype ", dtype_name(t->dtype()), ", expected contiguous ",
             f64 ? "f32 or f64" : "f32", " (", B, ", ", Hq, ", ", T, ")");
    check_dim(*t, name, 0, "batch", B, "(q's batch)");
    check_dim(*t, name, 1, "q_heads", Hq, "(q's q_heads)");
    check_dim(*t, name, 2, "q_len", T, "(q's q_len)");
    RA_CHECK(t->memory() == in.q.memory(), name, " must be in q's memory (host or device)");
  }
  if (o.defined()) {
    check_rank(o, "o", 4, "(batch, q_len, q_heads, v_head_dim)");
    RA_CHECK(o.dtype() == in.q.dtype() || o.dtype() == DType::kF32, "o has dtype ", dtype_name(o.dtype()),
             ", expected ", q_dtype_or_f32);
    for (int d = 0; d < 4; ++d)
      RA_CHECK(o.dim(d) == grad.d_o.dim(d), "o dimension ", d, " is ", o.dim(d), ", expected do's ", grad.d_o.dim(d),
               " (o ", o.shape().str(), ", do ", grad.d_o.shape().str(), ")");
  }
}

namespace {

template <typename T>
HostInputs as_host_inputs(const AttentionInputs& in, const TokenPositions& pos) {
  constexpr DType kDType = std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
  HostInputs out;
  auto view = [](const TensorView& t, Tensor& copy) {
    if (!t.defined() || (t.dtype() == kDType && t.stride(t.rank() - 1) == 1)) return t;
    copy = float_copy<T>(t);
    return copy.view();
  };
  out.q = view(in.q, out.q_copy);
  out.k = view(in.k, out.k_copy);
  out.v = view(in.v, out.v_copy);
  const Shape full{in.q.dim(0), in.q.dim(2), in.q.dim(1), pos.total_keys};
  if (in.bias.defined()) out.bias = broadcast_to(view(in.bias, out.bias_copy), full, "bias");
  if (in.mask.defined()) out.mask = broadcast_to(in.mask, full, "mask");
  out.sinks = view(in.sinks, out.sinks_copy);
  out.q_segment_ids = in.q_segment_ids;
  out.kv_segment_ids = in.kv_segment_ids;
  return out;
}

}  // namespace

F32Inputs as_f32_inputs(const AttentionInputs& in, const TokenPositions& pos) { return as_host_inputs<float>(in, pos); }
F64Inputs as_f64_inputs(const AttentionInputs& in, const TokenPositions& pos) { return as_host_inputs<double>(in, pos); }

TokenPositions TokenPositions::dense(int64_t t, int64_t s) {
  TokenPositions pos;
  pos.q.resize(size_t(t));
  pos.k.resize(size_t(s));
  for (int64_t i = 0; i < t; ++i) pos.q[size_t(i)] = i + (s - t);
  for (int64_t j = 0; j < s; ++j) pos.k[size_t(j)] = j;
  pos.total_keys = s;
  return pos;
}

std::vector<int32_t> segment_ids_from_cu_seqlens(const std::vector<int64_t>& cu) {
  RA_CHECK(!cu.empty() && cu.front() == 0, "cu_seqlens must start at 0");
  std::vector<int32_t> ids;
  for (size_t s = 1; s < cu.size(); ++s) {
    RA_CHECK(cu[s] >= cu[s - 1], "cu_seqlens must be non-decreasing (entry ", s, " is ", cu[s], " after ",
             cu[s - 1], ")");
    ids.insert(ids.end(), size_t(cu[s] - cu[s - 1]), int32_t(s - 1));
  }
  return ids;
}

float effective_scale(const AttentionParams& params, int64_t head_dim) {
  return params.softmax_scale > 0.0f ? params.softmax_scale : 1.0f / std::sqrt(float(head_dim));
}

std::string AttentionParams::describe() const {
  std::ostringstream out;
  out << "scale=" << softmax_scale << " causal=" << causal << " window=(" << window_left << "," << window_right
      << ") softcap=" << logits_soft_cap << " dropout=" << dropout_prob << " seed=" << dropout_seed;
  if (batch_offset || head_offset) out << " batch_offset=" << batch_offset << " head_offset=" << head_offset;
  if (flash_kernel != FlashKernel::kAuto) out << " flash_kernel=" << flash_kernel_name(flash_kernel);
  if (deterministic) out << " deterministic=1";
  return out.str();
}

const char* flash_kernel_name(FlashKernel kernel) {
  switch (kernel) {
    case FlashKernel::kAuto: return "auto";
    case FlashKernel::kMmaSync: return "mma_sync";
    case FlashKernel::kWgmma: return "wgmma";
  }
  return "?";
}

FlashKernel parse_flash_kernel(const std::string& text, const char* option) {
  for (FlashKernel kernel : {FlashKernel::kAuto, FlashKernel::kMmaSync, FlashKernel::kWgmma})
    if (text == flash_kernel_name(kernel)) return kernel;
  RA_FAIL(option, " '", text, "': expected auto, mma_sync or wgmma");
}

}  // namespace ra
