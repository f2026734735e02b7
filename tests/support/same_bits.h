// Whether two tensors hold the same bytes: the same bits, where a test asks for them (determinism, exact sums, a
// kernel's results against its own on other views). Either may be on the host or a GPU.
#pragma once

#include <cstring>

#include "runtime/memory.h"
#include "runtime/tensor.h"

namespace ra::test {

inline bool same_bits(const TensorView& a, const TensorView& b) {
  if (a.nbytes() != b.nbytes()) return false;
  const Tensor host_a = to_memory(a, MemoryKind::kHost), host_b = to_memory(b, MemoryKind::kHost);
  return std::memcmp(host_a.view().data(), host_b.view().data(), a.nbytes()) == 0;
}

}  // namespace ra::test
