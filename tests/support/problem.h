// Random attention problems for tests: shapes, dtypes and every option of AttentionParams, with
// inputs generated in the problem's dtype so that the f64 reference sees exactly what the kernels see.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/compare.h"
#include "attention/inputs.h"
#include "attention/params.h"
#include "attention/cpu/sdpa_cpu.h"
#include "attention/tolerance.h"

namespace ra::test {

struct Options {
  bool causal = false, window = false, softcap = false, sinks = false, bias = false, mask = false,
       segments = false, dropout = false;
  // A window of at most 3 keys to the left and 2 to the right (instead of `window`'s up to S / 3): the
  // ring's blocks wholly outside it are skipped, even where their position ranges overlap the queries'.
  bool narrow_window = false;
  // With `mask`: documents of 1 to 600 keys instead of random pairs, each query row keeping its document's keys (some
  // documents with holes, one pair in 16): whole tiles hidden, whole tiles kept, tiles across an edge. The mask's
  // shape by seed: (1, 1, T, S), (B, Hq, T, S) with each head's own documents, or (B, 1, T, S).
  bool mask_documents = false;
  std::string name() const;
};

// No option, each option alone, and all of them together (10 sets).
std::vector<Options> option_sets();

// How options.segments draws the ids: kFew sorted runs of up to S / 3 rows; kPacked sorted runs of 1 to 96
// rows (many documents: most blocks of queries and keys share none); kCycled runs of 1 to 40 rows whose
// ids cycle 0, 1, 2 (unsorted: one id recurs far apart, blocks' id ranges overlap without sharing); kLong
// sorted runs of 1 to 400 rows (key blocks inside one document, query blocks inside it and across its edges).
enum class SegmentIds { kFew, kPacked, kCycled, kLong };

struct ProblemSpec {
  int64_t batch = 1, q_len = 16, kv_len = 16, q_heads = 2, kv_heads = 2, head_dim = 32, v_head_dim = 32;
  DType dtype = DType::kF32;
  Options options;
  uint64_t seed = 1;
  SegmentIds segment_ids = SegmentIds::kFew;
};

class Problem {
 public:
  explicit Problem(const ProblemSpec& spec);
  AttentionInputs inputs() const;
  const AttentionParams& params() const { return params_; }
  AttentionParams& params() { return params_; }
  const ProblemSpec& spec() const { return spec_; }

  Tensor q, k, v, bias, mask, sinks, q_seg, kv_seg;

 private:
  ProblemSpec spec_;
  AttentionParams params_;
};

// max |v| over the value tensor (outputs are convex combinations of value rows).
double max_abs_value(const TensorView& v);

// A tensor's values (host or device, any float dtype) as f32 on the host.
std::vector<float> as_f32(const TensorView& t);

// compare() and Comparison: attention/compare.h (shared with `ringattn verify`).


}  // namespace ra::test
