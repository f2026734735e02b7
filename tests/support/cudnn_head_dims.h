// Test helper: problems on which cudnn runs with v_head_dim != head_dim, shared by the forward and
// backward suites.
#pragma once

#include <cstdint>
#include <vector>

#include "tests/support/problem.h"

namespace ra::test {

// MLA's 192 / 128, a wider and a narrower V, GQA, S != T, one query row, lengths off the tiles; each with
// the options cudnn expresses (alone, causal, sinks, causal with sinks), f16 and bf16 by turns. `seed`
// counts on.
inline std::vector<ProblemSpec> cudnn_head_dim_cases(uint64_t& seed) {
  struct Dims {
    int64_t b, t, s, hq, hkv, d, dv;
  };
  const Dims dims[] = {{1, 131, 203, 8, 4, 192, 128}, {2, 77, 77, 4, 4, 64, 128}, {1, 300, 517, 4, 1, 128, 64},
                       {2, 1, 97, 8, 2, 192, 128},   {1, 190, 190, 2, 2, 96, 64}};
  std::vector<ProblemSpec> cases;
  for (const Dims& d : dims)
    for (int o = 0; o < 4; ++o) {
      Options opt;
      opt.causal = o % 2 == 1;
      opt.sinks = o >= 2;
      const DType dtype = o % 3 == 0 ? DType::kF16 : DType::kBF16;
      cases.push_back(ProblemSpec{d.b, d.t, d.s, d.hq, d.hkv, d.d, d.dv, dtype, opt, seed++});
    }
  return cases;
}

}  // namespace ra::test
