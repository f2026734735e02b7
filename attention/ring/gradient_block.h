// The dK/dV accumulator that travels with a K/V block in the ring's backward (host and GPU rings): dK
// then dV of up to `slot_rows` rows in `dtype` (f32; bf16 with --grad-wire bf16), each section
// (B, rows, Hkv, X) from its start, the block's actual rows first.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/tensor.h"

namespace ra {

struct GradientBlock {
  int64_t batch, heads, dk_width, dv_width, slot_rows;
  DType dtype = DType::kF32;
  size_t dv_offset() const { return size_t(batch * slot_rows * heads * dk_width) * dtype_size(dtype); }
  size_t payload() const { return dv_offset() + size_t(batch * slot_rows * heads * dv_width) * dtype_size(dtype); }
  size_t dk_count(int64_t rows) const { return size_t(batch * rows * heads * dk_width); }
  size_t dv_count(int64_t rows) const { return size_t(batch * rows * heads * dv_width); }
  // The block's dK and dV (`rows` rows) at `payload_base`, as views in `memory`.
  TensorView dk_view(char* payload_base, int64_t rows, MemoryKind memory) const {
    return TensorView(payload_base, dtype, Shape{batch, rows, heads, dk_width}, memory);
  }
  TensorView dv_view(char* payload_base, int64_t rows, MemoryKind memory) const {
    return TensorView(payload_base + dv_offset(), dtype, Shape{batch, rows, heads, dv_width}, memory);
  }
  GradientBlock in_f32() const { return {batch, heads, dk_width, dv_width, slot_rows, DType::kF32}; }
};

}  // namespace ra
