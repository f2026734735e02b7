// The registry and AttentionImpl::forward.
#include "attention/registry.h"

#include <algorithm>

#include "attention/validate.h"
#include "runtime/error.h"

namespace ra {

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
    case Backend::kNative: return "native";
  }
  return "?";
}

Backend parse_backend(std::string_view name) {
  if (name == "cpu") return Backend::kCpu;
  if (name == "cuda" || name == "gpu") return Backend::kCuda;
  if (name == "native") return Backend::kNative;
  RA_FAIL("backend '", name, "' is unknown: expected cpu, cuda or native");
}

AttentionOutput AttentionImpl::forward(const AttentionInputs& in, const AttentionParams& params) const {
  return forward(in, params, TokenPositions::dense(in.q.dim(1), in.k.dim(1)));
}

AttentionOutput AttentionImpl::forward(const AttentionInputs& in, const AttentionParams& params,
                                       const TokenPositions& pos) const {
  check_alike([&] { validate_attention(in, params, pos, max_head_dim()); });
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), Dv = in.v.dim(3);
  const MemoryKind memory = in.q.memory();
  AttentionOutput out{Tensor(in.q.dtype(), {B, T, Hq, Dv}, memory), Tensor(DType::kF32, {B, Hq, T}, memory)};
  forward_into(in, params, pos, ForwardViews{out.o.view(), out.lse.view()});
  return out;
}

void check_flash_kernel_choice(const AttentionImpl& impl, const AttentionParams& params) {
  RA_CHECK(params.flash_kernel == FlashKernel::kAuto || impl.takes_flash_kernel(), "flash_kernel ",
           flash_kernel_name(params.flash_kernel), " chooses the kernels of flash_attn2 on cuda (and of the GPU ring "
           "over it), but implementation '", impl.name(), "' on ", backend_name(impl.backend()), " runs none of them");
}

void AttentionImpl::OneCallAtATime::refuse(const AttentionImpl& impl) {
  RA_FAIL("implementation '", impl.name(), "' on ", backend_name(impl.backend()), " is running a call on another thread: "
          "one object serves one call at a time (it keeps buffers and state between calls); make one object per thread");
}

void AttentionImpl::forward_into(const AttentionInputs& in, const AttentionParams& params, const TokenPositions& pos,
                                 const ForwardViews& out) const {
  const OneCallAtATime one_call(*this);
  check_alike([&] {
    validate_attention(in, params, pos, max_head_dim());
    check_flash_kernel_choice(*this, params);
    const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), Dv = in.v.dim(3);
    check_output(out.o, "o", Shape{B, T, Hq, Dv}, in.q, /*q_dtype_or_f32=*/true);
    check_output(out.lse, "lse", Shape{B, Hq, T}, in.q, /*q_dtype_or_f32=*/false);
    check_outputs_apart({{out.o, "o"}, {out.lse, "lse"}}, in);
  });
  const int64_t B = in.q.dim(0), T = in.q.dim(1), Hq = in.q.dim(2), Dv = in.v.dim(3);
  if (forward_direct(in, params, pos, out)) return;
  Carry carry = Carry::temporary(B, Hq, T, Dv, in.q.memory(), cuda_stream());
  accumulate(in, pos, params, carry);
  finalize(carry, in.sinks, out.o, out.lse, cuda_stream());
}

void AttentionRegistry::register_impl(const std::vector<std::string>& names, Backend backend, Factory factory) {
  RA_CHECK(!names.empty(), "register_impl needs a name");
  const std::string& canonical = names.front();
  for (const std::string& name : names) {
    auto it = aliases_.find(name);
    RA_CHECK(it == aliases_.end() || it->second == canonical, "attention name '", name, "' already belongs to '",
             it->second, "'");
    aliases_[name] = canonical;
  }
  auto key = std::make_pair(canonical, backend);
  RA_CHECK(!factories_.count(key), "implementation '", canonical, "' already has a ", backend_name(backend),
           " backend");
  factories_[key] = std::move(factory);
}

std::string AttentionRegistry::canonical_name(std::string_view name) const {
  auto it = aliases_.find(name);
  if (it != aliases_.end()) return it->second;
  std::string known;
  for (const std::string& n : list_implementations()) known += (known.empty() ? "" : ", ") + n;
  RA_FAIL("attention implementation '", name, "' is not registered; available: ", known);
}

std::vector<Backend> AttentionRegistry::get(std::string_view name) const {
  std::string canonical = canonical_name(name);
  std::vector<Backend> out;
  for (const auto& [key, factory] : factories_)
    if (key.first == canonical) out.push_back(key.second);
  return out;
}

std::unique_ptr<AttentionImpl> AttentionRegistry::create(std::string_view name, Backend backend,
                                                         const RingContext* ring) const {
  std::string canonical = canonical_name(name);
  auto it = factories_.find(std::make_pair(canonical, backend));
  if (it == factories_.end()) {
    std::string have;
    for (Backend b : get(canonical)) have += std::string(have.empty() ? "" : ", ") + std::string(backend_name(b));
    RA_FAIL("attention implementation '", canonical, "' has no ", backend_name(backend), " backend (it has: ", have,
            ")");
  }
  return it->second(ring);
}

std::vector<std::string> AttentionRegistry::list_implementations() const {
  std::vector<std::string> out;
  for (const auto& [key, factory] : factories_)
    if (std::find(out.begin(), out.end(), key.first) == out.end()) out.push_back(key.first);
  std::sort(out.begin(), out.end());
  return out;
}

const AttentionRegistry& AttentionRegistry::builtin() {
  static const AttentionRegistry registry = [] {
    AttentionRegistry r;
    register_builtin_implementations(r);
    return r;
  }();
  return registry;
}

}  // namespace ra
