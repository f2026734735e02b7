// The CPU `sdpa`: scores materialised row by row, softmax, weighted sum. In f32 it folds into the
// carry like every implementation; in f64 it is the test oracle (reference_attention_f64), forward and
// backward.
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

// The backward (attention/backward.h), materialised row by row in f32.
void sdpa_accumulate_backward_cpu(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& params,
                                  const BackwardInputs& grad, const GradViews& acc);

// The oracle's gradients of loss = sum(dO * O) (+ sum(dLSE * LSE)), all in f64 from the f64 forward (its O and LSE in `forward`).
struct ReferenceGradients {
  ReferenceOutput forward;
  std::vector<double> dq, dk, dv;  // shaped as q, k, v (contiguous)
  std::vector<double> dbias;       // the bias's shape; empty without a bias
  std::vector<double> dsinks;      // (Hq); empty without sinks
  // Each gradient element's sum of |terms|: what f32 arithmetic rounds, however far the terms cancel (a
  // softmax over one key, a constant V or K give dQ = dK = 0 exactly, from terms of the inputs' size).
  std::vector<double> dq_terms, dk_terms, dv_terms, dbias_terms, dsinks_terms;
};
// with_terms: also the *_terms sums (for comparisons; the f64 route for users leaves them out). d_lse
// (optional, (B, Hq, T)): the loss's gradient with respect to LSE too (BackwardInputs::d_lse).
ReferenceGradients reference_attention_backward_f64(const AttentionInputs& in, const AttentionParams& params,
                                                    const TokenPositions& pos, const TensorView& d_o,
                                                    bool with_terms = true, const TensorView& d_lse = TensorView());

}  // namespace ra
