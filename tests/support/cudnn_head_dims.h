// Test helper: shapes on which cudnn runs with v_head_dim != head_dim, shared by the forward and
// backward suites.
#pragma once

#include <cstdint>
#include <vector>

namespace ra::test {

struct CudnnHeadDims {
  int64_t b, t, s, hq, hkv, d, dv;
};

// MLA's 192 / 128, a wider and a narrower V, GQA, S != T, one query row, lengths off the tiles.
inline std::vector<CudnnHeadDims> cudnn_head_dim_pairs() {
  return {{1, 131, 203, 8, 4, 192, 128}, {2, 77, 77, 4, 4, 64, 128}, {1, 300, 517, 4, 1, 128, 64},
          {2, 1, 97, 8, 2, 192, 128},   {1, 190, 190, 2, 2, 96, 64}};
}

}  // namespace ra::test
