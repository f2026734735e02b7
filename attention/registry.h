// AttentionRegistry: implementations by name (with aliases) and backend, as the seeds' registry:
// register / get / create / list. A registry is a value the caller owns; `builtin()` returns one
// holding ringattn's own implementations (sdpa, flash_attn2, blockwise; ring where linked in).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attention/attention_impl.h"

namespace ra {

struct RingContext;  // attention/ring/ring.h: what `ring` needs (communicator, layout, global lengths)

class AttentionRegistry {
 public:
  // Factories receive the ring context when the caller has one (nullptr otherwise).
  using Factory = std::function<std::unique_ptr<AttentionImpl>(const RingContext*)>;

  // names: the canonical name first, then aliases. Registering a (name, backend) twice throws.
  void register_impl(const std::vector<std::string>& names, Backend backend, Factory factory);
  std::unique_ptr<AttentionImpl> create(std::string_view name, Backend backend,
                                        const RingContext* ring = nullptr) const;
  std::vector<Backend> get(std::string_view name) const;  // the backends an implementation has
  std::string canonical_name(std::string_view name) const;
  std::vector<std::string> list_implementations() const;  // canonical names, sorted

  static const AttentionRegistry& builtin();

 private:
  std::map<std::string, std::string, std::less<>> aliases_;  // any name -> canonical
  std::map<std::pair<std::string, Backend>, Factory> factories_;
};

// Adds ringattn's implementations (sdpa, flash_attn2, blockwise, ring on cpu / native; and sdpa,
// flash_attn2, ring on cuda when built with CUDA) to a registry.
void register_builtin_implementations(AttentionRegistry& registry);
void register_cuda_implementations(AttentionRegistry& registry);  // attention/cuda/, CUDA builds only

}  // namespace ra
