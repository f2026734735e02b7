#include "attention/ring/kv_rotation_cuda.h"

#include <algorithm>

#include "attention/ring/ring_schedule.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace ra {

std::vector<BlockSeal> read_seals(const BlockSeal* device, size_t count, cudaStream_t stream) {
  std::vector<BlockSeal> host(count);
  RA_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, count * sizeof(BlockSeal), cudaMemcpyDeviceToHost, stream));
  RA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

KvRotationCuda::KvRotationCuda(const AttentionInputs& in, const RingContext& ctx, const FaultPlan& fault,
                               std::vector<int64_t> rows_of, int64_t slot_rows, size_t extra_bytes,
                               RingDeviceState& state, cudaStream_t compute)
    : in_(in),
      ctx_(ctx),
      fault_(fault),
      state_(state),
      rows_of_(std::move(rows_of)),
      compute_(compute),
      n_(ctx.comm->size()),
      rank_(ctx.comm->rank()),
      layout_(in, slot_rows, 256) {
  payload_ = layout_.payload;
  bytes_ = sealed_bytes(payload_);
  stride_ = (bytes_ + 4095) / 4096 * 4096;
  verify_ = ctx.verify_blocks && n_ > 1;
  inputs_ready_.record(compute_);  // q, k and v written (by whatever the caller queued before this call)
  // Checks: per step, the checksum the block arrived with (its seal) and the one recomputed here;
  // then the seal of this rank's own block when it travels without being packed.
  reserve_scratch(state_.checks, (2 * n_ + 1) * sizeof(BlockSeal), MemoryKind::kCuda, "the ring's block checks");
  if (verify_ && !state_.check_stream) state_.check_stream = std::make_unique<CudaStream>();
  if (!state_.blocks_free) state_.blocks_free = std::make_unique<CudaEvent>();
  if (n_ == 1) return;
  base_[0] = state_.channel->window(2 * stride_ + extra_bytes);
  base_[1] = base_[0] + stride_;
  // This rank's own block: step 0 reads k and v where they are. Over copy engines its pieces go
  // straight from k, v and the segment ids into the next rank's window (packing them first cost the
  // first step's kernel about 1%; bench/RESULTS.md), with the seal computed over the pieces; the
  // window's alignment gaps, which no piece writes, are zeroed by their owner, so forwarded blocks
  // carry zeros there. NCCL sends one buffer, so for it the block is packed.
  own_pieces_ = {{in.k.data(), 0, in.k.nbytes()}, {in.v.data(), layout_.v_offset, in.v.nbytes()}};
  if (in.kv_segment_ids.defined())
    own_pieces_.push_back({in.kv_segment_ids.data(), layout_.segments_offset, in.kv_segment_ids.nbytes()});
  send_pieces_ = state_.channel->transport() == RingTransport::kCopyEngines &&
                 std::all_of(own_pieces_.begin(), own_pieces_.end(), [](const BlockPiece& piece) {
                   return reinterpret_cast<uintptr_t>(piece.data) % 16 == 0;  // what the checksum kernel reads
                 });
}

AttentionInputs KvRotationCuda::block(int step, int src) const {
  return step > 0 ? layout_.view(in_, base_[cur_], rows_of_[size_t(src)], MemoryKind::kCuda) : in_;
}

void KvRotationCuda::before_compute(int step, cudaStream_t stream) const {
  if (step > 0) RA_CUDA_CHECK(cudaStreamWaitEvent(stream, arrived_.get(), 0));
}

void KvRotationCuda::before_exchange(int step, cudaEvent_t compute_done) const {
  // Step 1's shift receives into the buffer the own block left from, read only by step 0's shift (on the
  // channel's stream): step 0's compute reads the caller's k and v. So it need not wait for that compute
  // (the backward's steps run beside the own block's, which may take the longer).
  if (step <= 1) return;
  state_.channel->wait_for(compute_done);
  if (verify_) state_.channel->wait_for(checked_[1 - cur_].get());  // the checksum of the block it replaces
}

void KvRotationCuda::prepare_own_block() {
  DeviceRingChannel& channel = *state_.channel;
  cudaStream_t stream = channel.stream();
  channel.wait_for(state_.blocks_free->get());  // the previous call's last reads (maybe on another stream)
  channel.wait_for(inputs_ready_.get());
  if (verify_) RA_CUDA_CHECK(cudaMemsetAsync(state_.checks.data<char>(), 0, 2 * n_ * sizeof(BlockSeal), stream));
  // The checksum covers the gaps: zeros in the buffer this rank's packed block leaves from, and in the
  // window it receives the first block into (the previous rank may send it as pieces).
  auto zero_gaps = [&](char* buffer, int64_t rows) {
    for (const KvBlockLayout::Span gap : layout_.padding(in_, rows))
      RA_CUDA_CHECK(cudaMemsetAsync(buffer + gap.offset, 0, gap.bytes, stream));
  };
  if (!send_pieces_) zero_gaps(base_[0], rows_of_[size_t(rank_)]);
  if (channel.transport() == RingTransport::kCopyEngines) zero_gaps(base_[1], rows_of_[size_t(ctx_.comm->previous())]);
  BlockSeal* own_seal = state_.checks.data<BlockSeal>() + 2 * n_;
  if (send_pieces_) {
    if (verify_) seal_pieces_cuda(own_seal, own_pieces_, uint32_t(rank_), stream);
    return;
  }
  for (const BlockPiece& piece : own_pieces_)
    RA_CUDA_CHECK(cudaMemcpyAsync(base_[0] + piece.offset, piece.data, piece.bytes, cudaMemcpyDeviceToDevice, stream));
  if (verify_) seal_block_cuda(base_[0], payload_, uint32_t(rank_), stream);
}

std::vector<DeviceRingChannel::Piece> KvRotationCuda::outgoing(int step) {
  const size_t offset = size_t(1 - cur_) * stride_;
  if (step == 0) prepare_own_block();
  if (step > 0 || !send_pieces_) return {{base_[cur_], offset, bytes_}};
  // The first shift's pieces (copy engines): the block's, then its seal.
  std::vector<DeviceRingChannel::Piece> pieces;
  for (const BlockPiece& piece : own_pieces_) pieces.push_back({piece.data, offset + piece.offset, piece.bytes});
  if (verify_) pieces.push_back({state_.checks.data<BlockSeal>() + 2 * n_, offset + payload_, sizeof(BlockSeal)});
  return pieces;
}

void KvRotationCuda::after_shift(int step) {
  cudaStream_t stream = state_.channel->stream();
  // The corruption fault lands before the check, as a flip in flight would.
  char* got = base_[1 - cur_];
  if (const std::optional<size_t> at = corrupted_byte(fault_, rank_, step, payload_)) flip_byte_cuda(got, *at, stream);
  arrived_.record(stream);
  if (!verify_) return;
  // The block that arrived is checked on a stream of its own at the compute stream's priority: its
  // blocks then run after the attention kernel's last ones are dispatched, on the SMs its last wave
  // leaves idle, instead of taking SMs from it at the channel's high priority. Only the transfer that
  // overwrites this buffer (two steps on) waits for it.
  cudaStream_t check = state_.check_stream->get();
  BlockSeal* arrived = state_.checks.data<BlockSeal>();
  RA_CUDA_CHECK(cudaStreamWaitEvent(check, arrived_.get(), 0));
  RA_CUDA_CHECK(cudaMemcpyAsync(&arrived[step + 1], got + payload_, sizeof(BlockSeal), cudaMemcpyDeviceToDevice, check));
  block_checksum_cuda(got, payload_, &arrived[n_ + step + 1].checksum, check);
  checked_[1 - cur_].record(check);
}

void KvRotationCuda::check_arrivals() const {
  if (!verify_) return;
  const std::vector<BlockSeal> host = read_seals(state_.checks.data<BlockSeal>(), 2 * size_t(n_),
                                                       state_.check_stream->get());
  for (int step = 1; step < n_; ++step) {
    const BlockSeal& got = host[size_t(step)];
    const uint64_t recomputed = host[size_t(n_ + step)].checksum;
    const int expected_origin = ring_source_rank(rank_, step, n_);
    RA_CHECK(got.magic == BlockSeal::kMagic && int(got.origin_rank) == expected_origin && got.checksum == recomputed,
             "ring step ", step - 1, " (", transport(), "): rank ", rank_, " received the K/V block of rank ",
             expected_origin, " from rank ", (rank_ + n_ - 1) % n_, " (k ", in_.k.shape().str(), " and v ",
             in_.v.shape().str(), ", ", payload_, " bytes) with checksum ", std::hex, recomputed,
             " but it was sent with ", got.checksum, std::dec, " (origin rank in the seal: ", got.origin_rank,
             "): the block was corrupted in flight; no output is produced");
  }
}

void KvRotationCuda::finish(cudaStream_t compute) const { state_.blocks_free->record(compute); }

}  // namespace ra
