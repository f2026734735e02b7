// The K/V half of a GPU ring call, shared by the forward and the backward: the two block buffers in the
// channel's window, this rank's own block leaving at the first exchange, the checksum of every block
// that arrives (queued on a check stream, compared on the host before anything is finalized) and the
// events that order the channel's stream against the compute stream. The caller walks the steps:
//
//   before_compute(step); <compute on block(step)>; compute_done.record(compute)
//   before_exchange(step, compute_done)   (the buffer it receives into is no longer read)
//   channel.shift(outgoing(step) [+ the caller's own pieces], ...); after_shift(step); wait; advance()
//
// Block layout: k, v, then the kv segment ids, each 256-byte aligned (the kernels' row loads stay on
// whole cache sectors), then the seal: the block's checksum and origin rank, computed once by the
// rank it starts on and forwarded with it. The two buffers start 4096 bytes apart or more. Sections are
// sized for the longest shard; a shorter block sits at the start of each, zeros behind it.
#pragma once

#include <memory>
#include <vector>

#include "attention/ring/block_checksum.h"
#include "attention/ring/device_channel.h"
#include "attention/ring/ring.h"
#include "runtime/cuda_device.h"

namespace ra {

// What a GPU ring keeps from call to call (grow-only; a cudaMalloc / cudaFree pair per call costs
// milliseconds and cudaFree stalls the device).
struct RingDeviceState {
  std::unique_ptr<DeviceRingChannel> channel;  // null for a ring of one rank
  Tensor checks;                               // the seals that arrived and the checksums recomputed
  std::unique_ptr<CudaStream> check_stream;    // checksums of arriving blocks; made on first use
  std::unique_ptr<CudaEvent> blocks_free;      // the last compute that read the buffers (previous call)
  std::unique_ptr<CudaStream> steps_stream;    // the backward's other ranks' blocks; made on first use
};

class KvRotationCuda {
 public:
  // `in`: this rank's inputs (its own K/V block). `rows_of(r)`: rank r's K/V rows; `slot_rows` the most
  // any rank holds. `extra_bytes` more of the window, after the two K/V buffers, are the caller's
  // (extra()). Queues nothing yet but the wait for what the caller queued before (inputs_ready).
  KvRotationCuda(const AttentionInputs& in, const RingContext& ctx, const FaultPlan& fault, std::vector<int64_t> rows_of,
                 int64_t slot_rows, size_t extra_bytes, RingDeviceState& state, cudaStream_t compute);

  const char* transport() const { return state_.channel ? state_.channel->description() : "one rank"; }
  char* extra() const { return base_[0] + 2 * stride_; }
  size_t window_offset_of_extra() const { return 2 * stride_; }
  // The block held at `step` (from rank `src`): the caller's k, v at step 0, the buffer after.
  AttentionInputs block(int step, int src) const;
  // Compute of step `step` (on the compute stream, or on `stream`) waits for the block it reads.
  void before_compute(int step) const { before_compute(step, compute_); }
  void before_compute(int step, cudaStream_t stream) const;
  // The next transfer waits until the buffer it receives into is no longer read: by the compute that
  // ended with `compute_done`, and by the checksum of the block it held (from step 2: before, no compute
  // read that buffer).
  void before_exchange(int step, cudaEvent_t compute_done) const;
  // The pieces that move this rank's held block to the next rank (step 0: packs or seals its own).
  std::vector<DeviceRingChannel::Piece> outgoing(int step);
  // After the shift is queued: the fault hook, the arrival event, the arrival's checksum.
  void after_shift(int step);
  void advance() { cur_ = 1 - cur_; }
  // Compares every arrival's seal with its recomputed checksum (waits for the check stream); throws
  // naming the step and the ranks on the first mismatch.
  void check_arrivals() const;
  // The last compute that read the buffers (the next call's first transfer waits for it).
  void finish(cudaStream_t compute) const;

 private:
  void prepare_own_block();

  const AttentionInputs& in_;
  const RingContext& ctx_;
  FaultPlan fault_;  // the pass's (RINGATTN_FAULT's pass=)
  RingDeviceState& state_;
  std::vector<int64_t> rows_of_;
  cudaStream_t compute_;
  int n_, rank_;
  KvBlockLayout layout_;
  size_t payload_, bytes_, stride_;
  bool verify_;
  char* base_[2] = {nullptr, nullptr};
  int cur_ = 0;
  std::vector<BlockPiece> own_pieces_;
  bool send_pieces_ = false;
  CudaEvent inputs_ready_, arrived_;
  CudaEvent checked_[2];  // after the checksum of the block that arrived in buffer i (its next writer waits)
};

// `count` seals from `device` (queued on `stream`, then waited for).
std::vector<BlockSeal> read_seals(const BlockSeal* device, size_t count, cudaStream_t stream);

}  // namespace ra
