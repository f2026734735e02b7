// Test helpers for the CUDA flash kernels' choice (AttentionParams::flash_kernel: mma.sync or wgmma, both passes).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attention/cuda/flash_cuda.h"
#include "tests/support/problem.h"

namespace ra::test {

// The option sets both flash kernels run in their instances for positions and segment ids: none, causal,
// window, sinks, causal with window, segments, causal segments.
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

// A soft cap, which both kernels run in instances of their own, beside segment ids too (Gemma 2's packed
// documents): alone, causal, a window with sinks, packed documents, causal packed documents.
inline std::vector<Options> soft_cap_option_sets() {
  std::vector<Options> sets(5);
  for (Options& o : sets) o.softcap = true;
  sets[1].causal = true;
  sets[2].window = sets[2].sinks = true;
  sets[3].segments = true;
  sets[4].causal = sets[4].segments = true;
  return sets;
}

// The options both kernels run in their extras instances (each logit formed pair by pair): bias, mask and
// dropout alone; a soft cap beside a mask and segment ids; bias and mask with causal; dropout with a window
// and sinks; every option at once.
inline std::vector<Options> extras_option_sets() {
  std::vector<Options> sets(7);
  sets[0].bias = true;
  sets[1].mask = true;
  sets[2].dropout = true;
  sets[3].softcap = sets[3].mask = sets[3].segments = true;
  sets[4].causal = sets[4].bias = sets[4].mask = true;
  sets[5].window = sets[5].sinks = sets[5].dropout = true;
  sets[6] = Options{true, true, true, true, true, true, true, true};
  return sets;
}

// The options the wgmma kernels' instances of one extra beside positions take (`extra`: &Options::bias, ::mask or
// ::dropout): alone, causal, a window, sinks, causal with a window and sinks; a bias or a mask also beside dropout,
// alone and with causal and sinks (their instances with dropout).
inline std::vector<Options> alone_option_sets(bool Options::* extra) {
  std::vector<Options> sets(extra == &Options::dropout ? 5 : 7);
  for (Options& o : sets) o.*extra = true;
  sets[1].causal = true;
  sets[2].window = true;
  sets[3].sinks = true;
  sets[4].causal = sets[4].window = sets[4].sinks = true;
  if (sets.size() == 7) sets[5].dropout = sets[6].dropout = sets[6].causal = sets[6].sinks = true;
  return sets;
}

// Every option set a flash kernel runs in an instance of its own (positions and segment ids, the soft cap, the
// extras): what the tests of a head dim's new instances run.
inline std::vector<Options> every_instance_option_set() {
  std::vector<Options> sets = wgmma_option_sets();
  for (const auto& more : {soft_cap_option_sets(), extras_option_sets()}) sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

// Packed or cycled documents (segment ids, every case) with the options of case o (0..3): alone, causal,
// window, causal with sinks; `extras` adds a soft cap (the kernels' soft-cap instances in cases 0 and 1, the
// extras instances with a mask in case 2 and dropout in case 3).
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

// A problem and the flash kernel forced on it (kAuto: the default choice).
struct DocumentCase {
  ProblemSpec spec;
  FlashKernel kernel;
};

// Packed, cycled and long documents on `shapes` (B, T, S, Hq, Hkv, D; shapes of many 64- and 128-row blocks, taken
// in turn by seed): each flash kernel forced without the extras, and with them `auto` (wgmma on a Hopper)
// and mma.sync forced; f16 and bf16 by turns. `seed` counts on.
inline std::vector<DocumentCase> document_cases(const std::vector<std::array<int64_t, 6>>& shapes, uint64_t& seed) {
  std::vector<DocumentCase> cases;
  for (SegmentIds ids : {SegmentIds::kPacked, SegmentIds::kCycled, SegmentIds::kLong})
    for (auto [kernel, extras] : {std::pair{FlashKernel::kAuto, true}, std::pair{FlashKernel::kWgmma, false},
                                  std::pair{FlashKernel::kMmaSync, false}, std::pair{FlashKernel::kMmaSync, true}})
      for (int o = 0; o < 4; ++o) {
        const auto& [b, t, s, hq, hkv, d] = shapes[seed % shapes.size()];
        ProblemSpec spec{b, t, s, hq, hkv, d, d, o % 2 ? DType::kBF16 : DType::kF16, document_options(o, extras), seed++};
        spec.segment_ids = ids;
        cases.push_back({spec, kernel});
      }
  return cases;
}

// Packed, cycled and long documents with dropout beside them (document_options' four cases without the extras, and
// dropout): the wgmma kernels' dropout instances with segment ids, on shapes of many 64- and 128-row blocks (D 64 /
// 128, GQA, B = 2, S != T), each kernel forced, f16 and bf16 by turns. `seed` counts on.
inline std::vector<DocumentCase> dropout_document_cases(uint64_t& seed) {
  const std::array<int64_t, 6> shapes[] = {{1, 700, 700, 4, 2, 128}, {2, 333, 600, 4, 4, 64}, {1, 517, 389, 8, 2, 128}};
  std::vector<DocumentCase> cases;
  for (SegmentIds ids : {SegmentIds::kPacked, SegmentIds::kCycled, SegmentIds::kLong})
    for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
      for (int o = 0; o < 4; ++o) {
        Options opt = document_options(o, false);
        opt.dropout = true;
        const auto& [b, t, s, hq, hkv, d] = shapes[seed % std::size(shapes)];
        ProblemSpec spec{b, t, s, hq, hkv, d, d, seed % 2 ? DType::kBF16 : DType::kF16, opt, seed++};
        spec.segment_ids = ids;
        cases.push_back({spec, kernel});
      }
  return cases;
}

// Head dims between the flash instances' 64 / 128 / 256 columns (multiples of 8: zero columns loaded, never
// stored) and Dv != D both ways (MLA's 192 / 128), on `shapes` (B, T, S, Hq, Hkv, taken in turn by seed): each
// kernel forced on every option set, twice, f16 and bf16 by turns. `seed` counts on.
inline std::vector<DocumentCase> padded_head_dim_cases(const std::vector<std::array<int64_t, 5>>& shapes, uint64_t& seed) {
  const std::pair<int64_t, int64_t> dims[] = {{32, 32}, {80, 80},  {96, 96},  {192, 128}, {64, 128},
                                              {128, 64}, {160, 160}, {8, 40}, {256, 200}, {72, 136}};
  std::vector<DocumentCase> cases;
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
    for (const Options& opt : option_sets())
      for (int repeat = 0; repeat < 2; ++repeat) {
        const auto& [b, t, s, hq, hkv] = shapes[seed % shapes.size()];
        const auto [d, dv] = dims[seed % std::size(dims)];
        cases.push_back({ProblemSpec{b, t, s, hq, hkv, d, dv, seed % 2 ? DType::kBF16 : DType::kF16, opt, seed}, kernel});
        ++seed;
      }
  return cases;
}

// The wgmma kernels' instances of one extra beside positions (`extra`): the bias instances (each step's bias tile
// staged in shared memory), the mask instances (a byte a pair), both with dropout too, the dropout instances (each
// row's key formed once).
// Rows of keys 16-byte aligned (S a multiple of 16), 4-byte aligned (S = 516, 260),
// alternately (S = 134) and never (odd S: byte by byte), several query blocks and key tiles with partial last ones,
// GQA, B = 2 beside a bias broadcast over batch (dBias from both) or a mask of its own per batch, T = 1, S < T,
// D 64 / 128 and the narrower dims the padded instances serve (96, 48); each kernel forced on
// alone_option_sets, twice, f16 and bf16 by turns. `seed` counts on.
inline std::vector<DocumentCase> alone_cases(bool Options::* extra, uint64_t& seed) {
  const std::array<int64_t, 6> shapes[] = {{1, 300, 516, 4, 1, 64}, {2, 257, 384, 8, 2, 128}, {1, 257, 134, 8, 2, 128},
                                           {2, 1, 99, 8, 2, 64},    {1, 190, 133, 2, 2, 128}, {2, 131, 256, 4, 4, 64},
                                           {1, 200, 260, 4, 2, 96}, {1, 150, 97, 4, 4, 48}};
  std::vector<DocumentCase> cases;
  for (FlashKernel kernel : {FlashKernel::kWgmma, FlashKernel::kMmaSync})
    for (const Options& opt : alone_option_sets(extra))
      for (int repeat = 0; repeat < 2; ++repeat) {
        const auto& [b, t, s, hq, hkv, d] = shapes[seed % std::size(shapes)];
        const DType dtype = seed % 2 ? DType::kBF16 : DType::kF16;
        cases.push_back({ProblemSpec{b, t, s, hq, hkv, d, d, dtype, opt, seed}, kernel});
        ++seed;
      }
  return cases;
}

// A mask of documents (Options::mask_documents: whole tiles hidden, whole tiles kept, tiles across an edge) on shapes
// of many 64-row chunks and 128-key tiles, on staged_alone_option_sets: the wgmma kernels' mask instances leave out
// what the mask's tile summary (MaskTiles) hides and read none of the mask where it keeps every pair. The wgmma
// kernel forced (elsewhere: mma.sync), f16 and bf16 by turns, the mask's three shapes by seed. `seed` counts on.
inline std::vector<DocumentCase> mask_tile_cases(uint64_t& seed) {
  const std::array<int64_t, 6> shapes[] = {{1, 700, 900, 4, 2, 128}, {2, 513, 640, 4, 1, 64}, {1, 1000, 1000, 2, 2, 128},
                                           {1, 384, 1031, 8, 2, 64},  {2, 640, 515, 4, 4, 128}};
  std::vector<DocumentCase> cases;
  for (Options opt : alone_option_sets(&Options::mask))
    for (int repeat = 0; repeat < 3; ++repeat) {
      opt.mask_documents = true;
      const auto& [b, t, s, hq, hkv, d] = shapes[seed % std::size(shapes)];
      const DType dtype = seed % 2 ? DType::kBF16 : DType::kF16;
      cases.push_back({ProblemSpec{b, t, s, hq, hkv, d, d, dtype, opt, seed}, FlashKernel::kWgmma});
      ++seed;
    }
  return cases;
}

// "", "_packed" or "_cycled": the test name's mark of ProblemSpec::segment_ids.
inline std::string segment_ids_suffix(SegmentIds ids) {
  return ids == SegmentIds::kPacked ? "_packed" : ids == SegmentIds::kCycled ? "_cycled" : ids == SegmentIds::kLong ? "_long" : "";
}

}  // namespace ra::test
