// AttentionInputs: the tensors of one attention call or one ring step, and the global positions of
// its rows. Shapes (B batch, T queries, S keys, Hq / Hkv heads, D / Dv head dims):
//   q (B, T, Hq, D), k (B, S, Hkv, D), v (B, S, Hkv, Dv); Hq a multiple of Hkv (GQA / MQA).
//   bias f32 and mask u8 (nonzero = attend), each broadcastable to (B, Hq, T, S_total): rows are local
//   query rows, columns global key indices; sinks f32 (Hq); segment ids i32 (B, T) and (B, S).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "runtime/tensor.h"

namespace ra {

struct AttentionInputs {
  TensorView q, k, v;
  TensorView bias, mask, sinks;
  TensorView q_segment_ids, kv_segment_ids;
  // The caller's name for the mask's bytes, 0 for none: calls that give the same nonzero name promise the same
  // bytes at the mask's address (a model's layers, and a forward and its backward, reading one mask), so the GPU
  // kernels summarise it once (attention/cuda/mask_tiles.h). ringattn.torch names a tensor by its version.
  uint64_t mask_identity = 0;
};

// Where rows sit in the global sequence. Queries are aligned to the end of the keys (bottom-right),
// as FlashAttention does for T != S: query i of T sees key j of S causally when j <= i + (S - T),
// so a single query (T == 1, autoregressive) sees every key and causal is a no-op there.
struct TokenPositions {
  std::vector<int64_t> q;  // key-axis position of each local query row
  std::vector<int64_t> k;  // global index of each local key row
  int64_t total_keys = 0;  // S of the whole sequence (bias / mask columns)

  // The single-process case: all T queries against all S keys.
  static TokenPositions dense(int64_t t, int64_t s);
};

// The first of `positions` where every entry is the first plus its index (one run, as a single call's and the
// contiguous layout's are), else none: the CUDA kernels then compute a row's position rather than read it.
std::optional<int64_t> run_start(std::span<const int64_t> positions);

// Whether key positions pair up as dropout's decisions do (dropout_key_word): each 16 entries from a multiple of 16
// are positions k and k + 8 with k's bit 3 clear, so that a kernel holding both hashes once for the two.
bool dropout_keys_pair_up(std::span<const int64_t> positions);

// Contiguous copies of every defined tensor of `in` in `memory` (e.g. host inputs staged to the
// device for the cuda backend), and the inputs viewing them.
struct InputsCopy {
  AttentionInputs inputs;
  std::vector<Tensor> storage;
};
InputsCopy copy_inputs(const AttentionInputs& in, MemoryKind memory);

// Segment ids for a packed variable-length batch from cumulative sequence lengths
// [0, l0, l0 + l1, ...]: token n gets the index of the sequence it falls in. Shape (1, total).
std::vector<int32_t> segment_ids_from_cu_seqlens(const std::vector<int64_t>& cu_seqlens);

}  // namespace ra
