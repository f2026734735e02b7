// The CPU `sdpa`: scores materialised row by row, softmax, weighted sum. In f32 it folds into the
// carry like every implementation; in f64 it is the test oracle (reference_attention_f64).
#pragma once

#include <vector>

#include "attention/attention_impl.h"

namespace ra {

void sdpa_accumulate_cpu(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                         Carry& carry);

struct ReferenceOutput {
  std::vector<double> o;    // (B, T, Hq, Dv)
  std::vector<double> lse;  // (B, Hq, T), natural log, -inf for rows that see no key
};
// All arithmetic in f64, sinks included; inputs are read as given (f16 / bf16 values are exact in f64).
ReferenceOutput reference_attention_f64(const AttentionInputs& in, const AttentionParams& params,
                                        const TokenPositions& pos);

}  // namespace ra
