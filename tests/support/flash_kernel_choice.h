// Test helpers for the CUDA flash kernels' choice (AttentionParams::flash_kernel: mma.sync or wgmma, both passes).
#pragma once

#include <string>
#include <vector>

#include "attention/cuda/flash_cuda.h"
#include "tests/support/problem.h"

namespace ra::test {

// The option sets both flash kernels run (the wgmma ones look only at positions and segment ids): none,
// causal, window, sinks, causal with window, segments, causal segments.
inline std::vector<Options> wgmma_option_sets() {
  std::vector<Options> sets(7);
  sets[1].causal = true;
  sets[2].window = true;
  sets[3].sinks = true;
  sets[4].causal = sets[4].window = true;
  sets[5].segments = true;
  sets[6].causal = sets[6].segments = true;
  return sets;
}

// Packed or cycled documents (segment ids, every case) with the options of case o (0..3): alone, causal,
// window, causal with sinks; `extras` adds what only the mma.sync kernels run (soft cap, with a mask in
// case 2 and dropout in case 3).
inline Options document_options(int o, bool extras) {
  Options opt;
  opt.segments = true;
  opt.causal = o == 1 || o == 3;
  opt.window = o == 2;
  opt.sinks = o == 3;
  opt.softcap = extras;
  opt.mask = extras && o == 2;
  opt.dropout = extras && o == 3;
  return opt;
}

// "", "_packed" or "_cycled": the test name's mark of ProblemSpec::segment_ids.
inline std::string segment_ids_suffix(SegmentIds ids) {
  return ids == SegmentIds::kPacked ? "_packed" : ids == SegmentIds::kCycled ? "_cycled" : "";
}

}  // namespace ra::test
