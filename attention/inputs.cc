// Copies of attention inputs between memory kinds.
#include "attention/inputs.h"

#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra {

InputsCopy copy_inputs(const AttentionInputs& in, MemoryKind memory) {
  InputsCopy out;
  out.storage.reserve(8);
  auto copy = [&](const TensorView& t, const char* name) {
    if (!t.defined()) return TensorView();
    RA_CHECK(t.is_contiguous(), name, " must be contiguous to be copied between host and device (shape ",
             t.shape().str(), ")");
    out.storage.push_back(to_memory(t, memory));
    return out.storage.back().view();
  };
  out.inputs.q = copy(in.q, "q");
  out.inputs.k = copy(in.k, "k");
  out.inputs.v = copy(in.v, "v");
  out.inputs.bias = copy(in.bias, "bias");
  out.inputs.mask = copy(in.mask, "mask");
  out.inputs.sinks = copy(in.sinks, "sinks");
  out.inputs.q_segment_ids = copy(in.q_segment_ids, "q_segment_ids");
  out.inputs.kv_segment_ids = copy(in.kv_segment_ids, "kv_segment_ids");
  return out;
}

std::optional<int64_t> run_start(std::span<const int64_t> positions) {
  if (positions.empty()) return std::nullopt;
  for (size_t i = 1; i < positions.size(); ++i)
    if (positions[i] != positions[0] + int64_t(i)) return std::nullopt;
  return positions[0];
}

bool dropout_keys_pair_up(std::span<const int64_t> positions) {
  for (size_t i = 0; i < positions.size(); ++i)
    if (i % 16 < 8 && ((positions[i] & 8) != 0 || (i + 8 < positions.size() && positions[i + 8] != positions[i] + 8)))
      return false;
  return true;
}

}  // namespace ra
