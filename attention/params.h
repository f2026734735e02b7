// AttentionParams: the options of an attention call, as the seeds name them (softmax_scale, causal,
// sliding_window, logits_soft_cap, dropout). Tensors that go with a call live in AttentionInputs.
#pragma once

#include <cstdint>
#include <string>

namespace ra {

// Which CUDA flash_attn2 kernels run (forward and backward): kAuto the fastest that can run these inputs
// (wgmma on Hopper for options that only look at positions, else mma.sync); kMmaSync or kWgmma force one.
enum class FlashKernel : uint8_t { kAuto, kMmaSync, kWgmma };
FlashKernel parse_flash_kernel(const std::string& text, const char* option);  // "auto" | "mma_sync" | "wgmma"
const char* flash_kernel_name(FlashKernel kernel);

struct AttentionParams {
  float softmax_scale = 0.0f;   // 0: 1 / sqrt(head_dim)
  bool causal = false;          // keys at positions after the query's are masked
  int64_t window_left = -1;     // sliding window: key visible when qpos - left <= kpos <= qpos + right;
  int64_t window_right = -1;    //   -1 leaves that side unbounded
  float logits_soft_cap = 0.0f; // 0: off; else logits = cap * tanh(logits / cap), before bias
  float dropout_prob = 0.0f;    // on the attention probabilities, deterministic in (seed, b, h, q, k)
  uint64_t dropout_seed = 0;
  // Where this call's batch and query heads start in the whole tensors (a mesh's dp / tp ranks, or a caller's
  // own sharding, hold a slice): dropout keys its decisions by global batch and head, as by global positions,
  // so a slice drops what the whole would and two slices never share a mask.
  int64_t batch_offset = 0;
  int64_t head_offset = 0;
  int64_t block_q = 64;         // chunk sizes of `blockwise` (the seeds' query_chunk_size / key_chunk_size)
  int64_t block_k = 64;
  // CUDA flash_attn2 only (the ring's too); any other implementation refuses a forced kernel
  // (check_flash_kernel_choice, attention/attention_impl.h).
  FlashKernel flash_kernel = FlashKernel::kAuto;
  // The backward's sums in a fixed order, so its gradients are the same bits on every run (for the same
  // shapes, ring size, layout and GPU model): the CUDA flash_attn2 backward adds dQ per block into slices of
  // its own, summed in order (memory: up to 16 f32 copies of dQ), cudnn takes its deterministic algorithm.
  // Host implementations are deterministic anyway (a broadcast bias's gradient too); the host ring's exact sums
  // are RingContext's.
  bool deterministic = false;

  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  std::string describe() const;  // one line, for logs and output attributes
};

// The effective softmax scale: params' value, or 1/sqrt(head_dim) when it is 0.
float effective_scale(const AttentionParams& params, int64_t head_dim);

}  // namespace ra
