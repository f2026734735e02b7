// What one trip of the host ring's backward (RingAttention::carry_gradients) computes and carries with
// each K/V block: the f32 dK/dV sums (bf16 on a bf16 wire), or the deterministic ring's fixed-point sums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "attention/inputs.h"

namespace ra {

struct GradientTrip {
  size_t wire_bytes = 0, part_bytes = 0;  // an accumulator in flight; one step's part (zeroed before compute)
  std::string wire_name;                  // for the errors on arrival
  // This rank's part of the held block's dK/dV (`rows` rows) into `part`.
  std::function<void(const AttentionInputs& block, const TokenPositions& block_pos, char* part, int64_t rows)> compute;
  std::function<void(char* wire, char* part, int64_t rows)> add_part;  // wire += part
  std::function<void(char* wire, int64_t rows)> take_home;  // after the last hop: this rank's own block
};

}  // namespace ra
