// `ringattn bench --segments N`: N documents of equal length packed into the global sequence, as
// `generate --segments N` writes them (the id of position p is p * N / seq), the work they leave, and the
// FLOP count's convention.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace ra::cli {

// (batch, positions.size()) int32 segment ids of the rows at these global positions.
inline Tensor packed_segment_ids(int64_t batch, const std::vector<int64_t>& positions, int64_t seq, int64_t segments) {
  Tensor ids(DType::kI32, {batch, int64_t(positions.size())});
  for (int64_t b = 0; b < batch; ++b)
    for (size_t i = 0; i < positions.size(); ++i)
      ids.data<int32_t>()[b * int64_t(positions.size()) + int64_t(i)] = int32_t(positions[i] * segments / seq);
  return ids;
}

// --mask-documents: the same documents as a boolean mask, u8 (1, 1, positions.size(), seq), each query row keeping
// its own document's keys (what Transformers' dense masks or Llama 4's chunked attention hand a kernel).
inline Tensor document_mask(const std::vector<int64_t>& positions, int64_t seq, int64_t segments) {
  const int64_t rows = int64_t(positions.size());
  Tensor mask(DType::kU8, {1, 1, rows, seq});
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t doc = positions[size_t(r)] * segments / seq;
    for (int64_t j = 0; j < seq; ++j) mask.data<uint8_t>()[r * seq + j] = j * segments / seq == doc;
  }
  return mask;
}

// --mask-named: the name (AttentionInputs::mask_identity) of the bench's mask, which no iteration changes.
constexpr uint64_t kBenchMaskName = 1;

// The (query, key) pairs one head attends over the whole sequence, the FLOP count's convention:
// seq^2 without documents, seq^2 / N with N of them (documents of seq / N rows), halved for causal.
inline double attended_pairs(int64_t seq, int64_t segments, bool causal) {
  double pairs = double(seq) * double(seq) / double(segments > 0 ? segments : 1);
  return causal ? pairs / 2 : pairs;
}

// The forward's FLOPs over `pairs` pairs per head: Q K^T (2 D each) and P V (2 Dv each); 4 B H pairs D
// where Dv = D. The backward counts 2.5 times these.
inline double attention_flops(int64_t batch, int64_t heads, double pairs, int64_t head_dim, int64_t v_head_dim) {
  return 2.0 * double(batch) * double(heads) * pairs * double(head_dim + v_head_dim);
}

// The tables' D column: "128", or "192/128" where Dv differs.
inline std::string head_dims_text(int64_t head_dim, int64_t v_head_dim) {
  std::string text = std::to_string(head_dim);
  if (v_head_dim != head_dim) text.append("/").append(std::to_string(v_head_dim));
  return text;
}

}  // namespace ra::cli
