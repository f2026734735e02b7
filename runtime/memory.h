// Raw memory of either kind behind one interface, so that tensors, carries and copies need not know
// whether they live on the host or on a CUDA device. In a build without CUDA, asking for device
// memory throws a clear error instead of failing to link.
#pragma once

#include <cstddef>

#include "runtime/tensor.h"

namespace ra {

// True when this build has the CUDA back end compiled in (independent of whether a GPU is present).
bool built_with_cuda();

// `what` names the tensor in the out-of-memory message (with the bytes asked for and the bytes free).
void* allocate_bytes(size_t bytes, MemoryKind memory, const char* what);
void release_bytes(void* p, MemoryKind memory);
void fill_zero_bytes(void* p, size_t bytes, MemoryKind memory);

// Copies between two contiguous views of the same dtype and element count, any memory kinds.
// Synchronous with respect to the host (device work already queued on the legacy stream finishes first).
void copy_tensor(const TensorView& dst, const TensorView& src);

// A contiguous copy of `src` in `memory` (a host copy of a device tensor, or the reverse).
Tensor to_memory(const TensorView& src, MemoryKind memory);

// Grow-only scratch for buffers reused across calls: afterwards `t` is a u8 tensor of at least `bytes`
// bytes in `memory` (reallocated, contents zeroed, only when it was smaller). Freeing the old device or
// pinned buffer waits for the device, so queued work that still reads it is safe.
void reserve_scratch(Tensor& t, size_t bytes, MemoryKind memory, const char* what);

// Sets every element of a contiguous f32 view to `value`.
void fill_f32(const TensorView& dst, float value);

}  // namespace ra
