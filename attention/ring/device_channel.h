// How the GPU ring moves its blocks between neighbours, chosen once per ring: NCCL send / receive, or
// copy engines writing into the next GPU's memory over CUDA IPC. Both passes of the GPU ring use it
// alike: the channel owns the receive window (one device allocation, grow-only, mapped into the
// previous rank when copy engines carry it) and a stream on which every transfer is queued; a shift
// copies pieces of this rank's memory to the same offsets in the next rank's window while the
// previous rank's pieces land in this one. The ring orders the stream against its compute with events.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "attention/ring/ring.h"
#include "collectives/communicator.h"
#include "runtime/tensor.h"

namespace ra {

class DeviceRingChannel {
 public:
  virtual ~DeviceRingChannel() = default;

  // kNccl or kCopyEngines, and its name in messages ("NCCL", "copy engines").
  virtual RingTransport transport() const = 0;
  const char* description() const { return transport() == RingTransport::kNccl ? "NCCL" : "copy engines"; }

  // Transfers queue here (high priority: they start while a long kernel still holds the SMs).
  virtual cudaStream_t stream() const = 0;
  // The next transfer queued starts only after `event` (recorded by the caller).
  void wait_for(cudaEvent_t event) const;

  // The receive window, at least `bytes` long (the same on every rank). Collective over the ring when it
  // grows under copy engines (the mapping is made again); the old window's contents are gone then.
  virtual char* window(size_t bytes) = 0;

  // `bytes` from `source` (this rank's device memory, the window included) to `offset` in the next
  // rank's window.
  struct Piece {
    const void* source;
    size_t offset, bytes;
  };
  // Ring step `step` (numbered alike on every rank, each number used once per call): the pieces go to
  // the next rank while the previous rank's, laid out alike, arrive in this window. Queued on stream();
  // the returned exchange waits for it with the deadline, naming the step and the peers.
  virtual std::unique_ptr<PendingExchange> shift(const std::vector<Piece>& pieces, int step,
                                                 std::chrono::milliseconds timeout) = 0;
};

// The channel for `ctx` (ring of more than one rank): copy engines where every rank can use them and
// the transport allows it, else NCCL (ctx.comm must then be NCCL; ranks sharing a GPU have no NCCL).
// Collective over the ring. Throws, naming why, when the asked transport cannot run.
std::unique_ptr<DeviceRingChannel> make_device_ring_channel(const RingContext& ctx);

}  // namespace ra
