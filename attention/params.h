// AttentionParams: the options of an attention call, as the seeds name them (softmax_scale, causal,
// sliding_window, logits_soft_cap, dropout). Tensors that go with a call live in AttentionInputs.
#pragma once

#include <cstdint>
#include <string>

namespace ra {

struct AttentionParams {
  float softmax_scale = 0.0f;   // 0: 1 / sqrt(head_dim)
  bool causal = false;          // keys at positions after the query's are masked
  int64_t window_left = -1;     // sliding window: key visible when qpos - left <= kpos <= qpos + right;
  int64_t window_right = -1;    //   -1 leaves that side unbounded
  float logits_soft_cap = 0.0f; // 0: off; else logits = cap * tanh(logits / cap), before bias
  float dropout_prob = 0.0f;    // on the attention probabilities, deterministic in (seed, b, h, q, k)
  uint64_t dropout_seed = 0;
  int64_t block_q = 64;         // chunk sizes of `blockwise` (the seeds' query_chunk_size / key_chunk_size)
  int64_t block_k = 64;

  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  std::string describe() const;  // one line, for logs and output attributes
};

}  // namespace ra
