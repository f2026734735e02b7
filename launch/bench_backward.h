// `ringattn bench --backward` (launch/bench_backward.cc): one rank's local backward, timed.
#pragma once

#include "launch/commands.h"

namespace ra::cli {

struct BackwardBenchShape {
  int64_t batch, seq, heads, kv_heads, head_dim, v_head_dim, iters, warmup;
  DType dtype;
  DType gradient_wire = DType::kF32;  // --grad-wire
  int64_t segments = 0;               // --segments: packed documents
  bool bias = false, mask = false;    // --bias, --mask: one (T, S) matrix each, broadcast
  bool step_times = false;            // --step-times: the GPU ring's spans of device time, per rank
  bool f32_gradients = false;         // --f32-gradients: dq, dk, dv in f32 (through f32 accumulators)
  bool mask_documents = false;        // --mask-documents: the documents as a boolean mask, not segment ids
  bool mask_named = false;            // --mask-named: the mask's tile summary made once (AttentionInputs::mask_identity)
};

int bench_backward(const BackwardBenchShape& shape, const AttentionOptions& opts, Job& job);

}  // namespace ra::cli
