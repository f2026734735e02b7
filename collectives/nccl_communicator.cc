// NCCL communicator: non-blocking init and group calls, completion through a CUDA event polled
// together with ncclCommGetAsyncError, abort on error or deadline.
#include "collectives/nccl_communicator.h"

#include <nccl.h>

#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "runtime/cuda_device.h"

namespace ra {
namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_error_text(ncclResult_t r, ncclComm_t comm) {
  std::string text = ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last) text += std::string(": ") + last;
  }
  return text;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

class NcclExchange final : public PendingExchange {
 public:
  NcclExchange(NcclCommunicator& comm, cudaEvent_t event, int tag) : comm_(comm), event_(event), tag_(tag) {}
  void wait(std::chrono::milliseconds timeout) override {
    comm_.wait_event(event_, timeout,
                     detail::concat("ring step ", tag_, " (NCCL): rank ", comm_.rank(), " waited for the block from rank ",
                                    comm_.previous(), " and its send to rank ", comm_.next()));
  }

 private:
  NcclCommunicator& comm_;
  cudaEvent_t event_;
  int tag_;
};

}  // namespace

NcclCommunicator::NcclCommunicator(const MpiCommunicator& bootstrap, std::chrono::milliseconds init_timeout)
    : rank_(bootstrap.rank()), size_(bootstrap.size()) {
  ncclUniqueId id{};
  if (rank_ == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    RA_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: ", ncclGetErrorString(r));
  }
  const int mpi_status = MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, bootstrap.comm());
  RA_CHECK(mpi_status == MPI_SUCCESS, "broadcasting the NCCL unique id over MPI failed");
  init(&id, init_timeout);
}

NcclCommunicator::NcclCommunicator(const std::string& unique_id, int rank, int size,
                                   std::chrono::milliseconds init_timeout)
    : rank_(rank), size_(size) {
  check_arguments(unique_id, rank, size);
  ncclUniqueId id{};
  std::memcpy(&id, unique_id.data(), sizeof(id));
  init(&id, init_timeout);
}

void NcclCommunicator::check_arguments(const std::string& unique_id, int rank, int size) {
  RA_CHECK(unique_id.size() == sizeof(ncclUniqueId), "unique_id has ", unique_id.size(), " bytes, expected ",
           sizeof(ncclUniqueId), " (the bytes of one rank's NCCL unique id)");
  RA_CHECK(size > 0 && rank >= 0 && rank < size, "rank ", rank, " of size ", size, ": expected 0 <= rank < size");
}

std::string NcclCommunicator::unique_id() {
  ncclUniqueId id{};
  const ncclResult_t r = ncclGetUniqueId(&id);
  RA_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: ", ncclGetErrorString(r));
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

void NcclCommunicator::init(const void* id, std::chrono::milliseconds init_timeout) {
  RA_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns; progress and errors are polled with a deadline
  ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, *static_cast<const ncclUniqueId*>(id), rank_, &config);
  if (r != ncclSuccess && r != ncclInProgress) RA_FAIL("ncclCommInitRankConfig failed on rank ", rank_, ": ", ncclGetErrorString(r));
  wait_enqueued(detail::concat("NCCL communicator set-up on rank ", rank_, " of ", size_, " (a peer rank missing or stuck?)"),
                init_timeout);
}

NcclCommunicator::NcclCommunicator() { RA_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming)); }

std::unique_ptr<NcclCommunicator> NcclCommunicator::adopt(ncclComm* comm) {
  RA_CHECK(comm != nullptr, "NcclCommunicator::adopt needs an initialized ncclComm_t (got null)");
  std::unique_ptr<NcclCommunicator> adopted(new NcclCommunicator());
  adopted->comm_ = comm;
  adopted->owned_ = false;
  adopted->read_rank_and_size("an adopted communicator");
  return adopted;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::split(int color, int key, const std::string& what) {
  check_state("split");
  RA_CHECK(color >= 0, "NcclCommunicator::split for ", what, ": color ", color, " (every rank joins a group here)");
  std::unique_ptr<NcclCommunicator> part(new NcclCommunicator());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommSplit(comm_, color, key, &part->comm_, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    abort();
    RA_FAIL("ncclCommSplit for ", what, " failed on rank ", rank_, ": ", nccl_error_text(r, comm_));
  }
  wait_enqueued(detail::concat("ncclCommSplit for ", what, " on rank ", rank_), op_timeout_);  // the parent's part
  part->op_timeout_ = op_timeout_;
  part->wait_enqueued(detail::concat("NCCL communicator set-up for ", what, " on rank ", rank_), op_timeout_);
  part->read_rank_and_size(what);
  return part;
}

void NcclCommunicator::read_rank_and_size(const std::string& what) {
  ncclResult_t r = ncclCommUserRank(comm_, &rank_);
  if (r == ncclSuccess) r = ncclCommCount(comm_, &size_);
  RA_CHECK(r == ncclSuccess, "the NCCL communicator for ", what, " cannot report its rank and size: ",
           nccl_error_text(r, comm_));
}

NcclCommunicator::~NcclCommunicator() {
  // During error unwinding a peer may be gone: finalizing would wait on it, so abort instead.
  if (comm_ != nullptr && !aborted_ && owned_ && std::uncaught_exceptions() > 0) abort();
  if (comm_ != nullptr && !aborted_ && owned_) {
    // Finalize flushes outstanding work; bounded, and an abort when it does not finish.
    (void)cudaStreamSynchronize(stream_.get());
    ncclCommFinalize(comm_);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress && Clock::now() < deadline) ncclCommGetAsyncError(comm_, &state);
    if (state == ncclSuccess) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
  }
  if (done_) (void)cudaEventDestroy(done_);
}

void NcclCommunicator::abort() {
  if (comm_ != nullptr && !aborted_) ncclCommAbort(comm_);
  aborted_ = true;
}

void NcclCommunicator::check_state(const char* where) {
  RA_CHECK(!aborted_, "the NCCL communicator of rank ", rank_, " was aborted after an earlier failure (", where, ")");
  ncclResult_t state = ncclSuccess;
  ncclCommGetAsyncError(comm_, &state);
  if (state != ncclSuccess && state != ncclInProgress) {
    const std::string text = nccl_error_text(state, comm_);
    abort();
    RA_FAIL("NCCL error on rank ", rank_, " in ", where, ": ", text);
  }
}

void NcclCommunicator::wait_enqueued(const std::string& what, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const std::string text = nccl_error_text(state, comm_);
      abort();
      RA_FAIL(what, ": NCCL error on rank ", rank_, ": ", text);
    }
    if (Clock::now() > deadline) {
      abort();
      RA_FAIL(what, ": not started within ", timeout.count(), " ms; the NCCL communicator was aborted");
    }
    std::this_thread::yield();
  }
}

void NcclCommunicator::wait_event(cudaEvent_t event, std::chrono::milliseconds timeout, const std::string& what) {
  const cudaError_t status = poll_event(event, timeout, [&] { check_state(what.c_str()); });
  if (status == cudaSuccess) return;
  abort();
  if (status == cudaErrorTimeout) RA_FAIL(what, ": not done within ", timeout.count(), " ms; the NCCL communicator was aborted");
  RA_FAIL(what, ": CUDA error ", cudaGetErrorName(status));
}

void NcclCommunicator::stream_wait(cudaEvent_t event) { RA_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), event, 0)); }

std::unique_ptr<PendingExchange> NcclCommunicator::ring_shift(const void* send, void* recv, size_t bytes, int tag) {
  check_state("ring_shift");
  if (size_ == 1) {
    if (send != recv) RA_CUDA_CHECK(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream_.get()));
  } else {
    ncclGroupStart();
    ncclSend(send, bytes, ncclUint8, next(), comm_, stream_.get());
    ncclRecv(recv, bytes, ncclUint8, previous(), comm_, stream_.get());
    const ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
      abort();
      RA_FAIL("ring step ", tag, " (NCCL): queuing the send to rank ", next(), " and the receive from rank ", previous(),
              " failed: ", ncclGetErrorString(r));
    }
    wait_enqueued(detail::concat("ring step ", tag, " (NCCL): rank ", rank_, " starting the exchange with rank ",
                                 previous(), " (receive) and rank ", next(), " (send)"),
                  op_timeout_);
  }
  RA_CUDA_CHECK(cudaEventRecord(done_, stream_.get()));
  return std::make_unique<NcclExchange>(*this, done_, tag);
}

void NcclCommunicator::all_reduce(double* data, size_t count, ReduceOp op) {
  staged_all_reduce(data, count * sizeof(double), count, op, ncclFloat64);
}

void NcclCommunicator::all_reduce(int64_t* data, size_t count, ReduceOp op) {
  staged_all_reduce(data, count * sizeof(int64_t), count, op, ncclInt64);
}

void NcclCommunicator::staged_all_reduce(void* data, size_t bytes, size_t count, ReduceOp op, int nccl_type) {
  check_state("all_reduce");
  void* device = cuda_allocate(bytes, "an all-reduce buffer");
  RA_CUDA_CHECK(cudaMemcpyAsync(device, data, bytes, cudaMemcpyHostToDevice, stream_.get()));
  ncclAllReduce(device, device, count, static_cast<ncclDataType_t>(nccl_type), nccl_op(op), comm_, stream_.get());
  wait_enqueued("NCCL all_reduce", op_timeout_);
  RA_CUDA_CHECK(cudaMemcpyAsync(data, device, bytes, cudaMemcpyDeviceToHost, stream_.get()));
  RA_CUDA_CHECK(cudaEventRecord(done_, stream_.get()));
  wait_event(done_, op_timeout_, "NCCL all_reduce");
  cuda_release(device);
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
  check_state("all_gather");
  ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm_, stream_.get());
  wait_enqueued("NCCL all_gather", op_timeout_);
  RA_CUDA_CHECK(cudaEventRecord(done_, stream_.get()));
  wait_event(done_, op_timeout_, "NCCL all_gather");
}

void NcclCommunicator::broadcast(void* data, size_t bytes, int root) {
  check_state("broadcast");
  ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_.get());
  wait_enqueued("NCCL broadcast", op_timeout_);
  RA_CUDA_CHECK(cudaEventRecord(done_, stream_.get()));
  wait_event(done_, op_timeout_, "NCCL broadcast");
}

void NcclCommunicator::barrier() {
  int64_t token = 0;
  all_reduce(&token, 1, ReduceOp::kSum);
}

}  // namespace ra
