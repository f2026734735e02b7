// `ringattn bench --bias` / `--mask`: one (rows, keys) matrix broadcast over batch and heads, as a shared
// relative-position bias or a shared mask is, over this rank's query rows and every key (the kernels index
// both by global key position). What they cost is each pair's read: staged a tile at a time where the wgmma
// kernels have a bias or mask instance, else with its logit formed pair by pair.
#pragma once

#include <cstdint>
#include <random>

#include "runtime/random.h"
#include "runtime/tensor.h"

namespace ra::cli {

// f32 (1, 1, rows, keys), standard normal.
inline Tensor bench_bias(int64_t rows, int64_t keys, std::mt19937_64& rng) {
  return random_normal(DType::kF32, {1, 1, rows, keys}, rng);
}

// u8 (1, 1, rows, keys): each pair kept with probability 7 / 8.
inline Tensor bench_mask(int64_t rows, int64_t keys, std::mt19937_64& rng) {
  Tensor mask(DType::kU8, {1, 1, rows, keys});
  uint8_t* m = mask.data<uint8_t>();
  for (int64_t i = 0; i < mask.numel(); i += 8) {
    const uint64_t bits = rng();  // 8 pairs per draw: one byte each, hidden when its low 3 bits are 0
    for (int64_t j = 0; j < 8 && i + j < mask.numel(); ++j) m[i + j] = ((bits >> (8 * j)) & 7) != 0;
  }
  return mask;
}

}  // namespace ra::cli
