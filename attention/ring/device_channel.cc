// The GPU ring's two channels: NCCL (the ring's communicator) and copy engines (PeerCopyRing).
#include "attention/ring/device_channel.h"

#include "collectives/nccl_communicator.h"
#include "collectives/peer_copy_ring.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra {

void DeviceRingChannel::wait_for(cudaEvent_t event) const { RA_CUDA_CHECK(cudaStreamWaitEvent(stream(), event, 0)); }

namespace {

class NcclChannel final : public DeviceRingChannel {
 public:
  explicit NcclChannel(NcclCommunicator& nccl) : nccl_(nccl) {}
  RingTransport transport() const override { return RingTransport::kNccl; }
  cudaStream_t stream() const override { return nccl_.stream(); }
  char* window(size_t bytes) override {
    reserve_scratch(window_, bytes, MemoryKind::kCuda, "the ring's receive buffers");
    return window_.data<char>();
  }
  std::unique_ptr<PendingExchange> shift(const std::vector<Piece>& pieces, int step,
                                         std::chrono::milliseconds timeout) override {
    RA_CHECK(!pieces.empty(), "the NCCL ring channel was asked to shift nothing at step ", step);
    nccl_.set_timeout(timeout);
    // One send / receive pair per piece, in order on the one stream: the last one's completion is all of them.
    std::unique_ptr<PendingExchange> last;
    for (const Piece& piece : pieces) last = nccl_.ring_shift(piece.source, window_.data<char>() + piece.offset, piece.bytes, step);
    return last;
  }

 private:
  NcclCommunicator& nccl_;
  Tensor window_;
};

class CopyEngineChannel final : public DeviceRingChannel {
 public:
  explicit CopyEngineChannel(MpiCommunicator& host) : host_(host) {}
  ~CopyEngineChannel() override { peers_.reset(); }  // the mapping goes before the window
  RingTransport transport() const override { return RingTransport::kCopyEngines; }
  cudaStream_t stream() const override { return stream_.get(); }
  char* window(size_t bytes) override {
    // The previous rank maps this window: it is replaced (on every rank alike, the sizes agree) only
    // after that mapping is gone.
    if (peers_ && peers_->window_bytes() >= bytes) return window_.data<char>();
    peers_.reset();
    reserve_scratch(window_, bytes, MemoryKind::kCuda, "the ring's receive window");
    peers_ = std::make_unique<PeerCopyRing>(host_, window_.data<char>(), window_.view().nbytes(), stream_.get());
    return window_.data<char>();
  }
  std::unique_ptr<PendingExchange> shift(const std::vector<Piece>& pieces, int step,
                                         std::chrono::milliseconds timeout) override {
    RA_CHECK(peers_ != nullptr, "the copy-engine ring shifted before its window existed");
    std::vector<PeerCopyRing::Piece> copies;
    for (const Piece& piece : pieces) copies.push_back({piece.source, piece.offset, piece.bytes});
    return peers_->shift(copies, step, timeout);
  }

 private:
  MpiCommunicator& host_;
  CudaStream stream_{StreamPriority::kHigh};
  Tensor window_;
  std::unique_ptr<PeerCopyRing> peers_;
};

}  // namespace

std::unique_ptr<DeviceRingChannel> make_device_ring_channel(const RingContext& ctx) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(ctx.comm);
  MpiCommunicator* host = ctx.host_comm != nullptr ? ctx.host_comm : dynamic_cast<MpiCommunicator*>(ctx.comm);
  const int n = ctx.comm->size(), rank = ctx.comm->rank();
  RA_CHECK(host == nullptr || (host->size() == n && host->rank() == rank), "RingContext::host_comm is rank ",
           host ? host->rank() : 0, " of ", host ? host->size() : 0, " but the ring's communicator is rank ", rank,
           " of ", n);
  if (ctx.transport == RingTransport::kNccl) {
    RA_CHECK(nccl != nullptr, "ring transport nccl needs an NCCL communicator for the sequence axis (got '",
             ctx.comm->backend_name(), "'; ranks that share a GPU cannot use NCCL: use --ring-transport auto)");
    return std::make_unique<NcclChannel>(*nccl);
  }
  RA_CHECK(host != nullptr || ctx.transport == RingTransport::kAuto,
           "ring transport copy-engines needs the sequence axis over MPI too (RingContext::host_comm)");
  std::string why = "the sequence axis has no MPI communicator";
  if (host != nullptr && PeerCopyRing::supported(*host, &why)) return std::make_unique<CopyEngineChannel>(*host);
  RA_CHECK(ctx.transport == RingTransport::kAuto, "ring transport copy-engines cannot run here (it needs each rank's "
           "next rank on the same node, with peer access and interprocess events): ", why,
           " (use --ring-transport nccl or auto)");
  RA_CHECK(nccl != nullptr, "the GPU ring cannot move its blocks: copy engines cannot run here (", why,
           ") and the sequence axis is not over NCCL (got '", ctx.comm->backend_name(), "')");
  return std::make_unique<NcclChannel>(*nccl);
}

}  // namespace ra
