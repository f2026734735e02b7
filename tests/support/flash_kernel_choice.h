// Test helpers for the CUDA flash kernels' choice (AttentionParams::flash_kernel: mma.sync or wgmma, both passes).
#pragma once

#include <vector>

#include "attention/cuda/flash_cuda.h"
#include "tests/support/problem.h"

namespace ra::test {

// The option sets both flash kernels run (the wgmma ones look only at positions): none, causal,
// window, sinks, causal with window.
inline std::vector<Options> positional_option_sets() {
  std::vector<Options> sets(5);
  sets[1].causal = true;
  sets[2].window = true;
  sets[3].sinks = true;
  sets[4].causal = sets[4].window = true;
  return sets;
}

}  // namespace ra::test
