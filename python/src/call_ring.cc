#include "call_ring.h"

#include <nanobind/stl/string.h>

#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

#include "attention/registry.h"
#include "collectives/call_agreement.h"
#include "collectives/mpi_check.h"
#include "collectives/mpi_communicator.h"
#include "mesh/sequence_layout.h"
#include "nccl_comm.h"
#include "python_communicator.h"
#include "runtime/checksum.h"
#include "runtime/error.h"
#include "runtime/memory.h"

#if RA_HAVE_CUDA
#include "attention/ring/ring_cuda.h"
#include "collectives/nccl_communicator.h"
#include "collectives/peer_copy_ring.h"
#endif

namespace ra::python {
namespace {

constexpr size_t kKeptRings = 4;

// The GPU ring's communicators over the caller's MPI ranks: MPI itself where copy engines can carry
// every block (the same node, peer access), otherwise an NCCL communicator bootstrapped over MPI.
void use_device_ring(Communicator& communicator, RingContext& ctx, std::unique_ptr<Communicator>& nccl) {
#if RA_HAVE_CUDA
  auto* mpi = dynamic_cast<MpiCommunicator*>(&communicator);
  RA_CHECK(mpi != nullptr, "ring_attention on CUDA arrays needs comm to be an mpi4py communicator (under mpirun) or "
           "a ringattn.NcclComm (under torchrun)");
  ctx.host_comm = mpi;
  if (!PeerCopyRing::supported(*mpi)) nccl = std::make_unique<NcclCommunicator>(*mpi);
#else
  RA_FAIL("ring_attention on CUDA arrays: this build of ringattn has no CUDA back end");
#endif
}

// Kept rings in the order they were made; every rank makes and drops them in the same order.
struct KeptRings {
  std::mutex mutex;
  std::deque<std::unique_ptr<CallRing>> rings;
};
KeptRings& kept() {
  static KeptRings* rings = new KeptRings;  // never destroyed at exit: teardown is collective (release_kept_rings)
  return *rings;
}

// The kept ring for `config` whose communicator is `caller`'s ranks in the same order, or nullptr.
CallRing* find_kept(MPI_Comm caller, const RingConfig& config) {
  std::lock_guard<std::mutex> lock(kept().mutex);
  for (auto& ring : kept().rings) {
    if (ring->caller_nccl || !(ring->config == config)) continue;
    int same = MPI_UNEQUAL;
    RA_MPI_CHECK(MPI_Comm_compare(caller, static_cast<MpiCommunicator&>(*ring->communicator).comm(), &same));
    if (same == MPI_CONGRUENT) return ring.get();
  }
  return nullptr;
}

// The kept ring for `config` over the caller's NCCL communicator itself, or nullptr.
CallRing* find_kept(const Communicator* caller, const RingConfig& config) {
  std::lock_guard<std::mutex> lock(kept().mutex);
  for (auto& ring : kept().rings)
    if (ring->caller_nccl.get() == caller && ring->config == config) return ring.get();
  return nullptr;
}

// Takes `ring` out of the kept ones without destroying it (a failed call: its teardown is collective).
void forget_kept(CallRing* ring) {
  std::lock_guard<std::mutex> lock(kept().mutex);
  for (auto it = kept().rings.begin(); it != kept().rings.end(); ++it)
    if (it->get() == ring) {
      (void)it->release();
      kept().rings.erase(it);
      return;
    }
}

void check_shard_rows(const CallRing& ring, const AttentionInputs& in) {
  const RingContext& ctx = ring.ctx;
  for (auto [t, name, rows, global] : {std::tuple{&in.q, "q", ring.pos.q.size(), ctx.global_q_len},
                                       std::tuple{&in.k, "k", ring.pos.k.size(), ctx.global_kv_len}})
    RA_CHECK(t->dim(1) == int64_t(rows), name, " has ", t->dim(1), " rows (dimension 1) on rank ", ctx.comm->rank(),
             ", but the ", ring.config.layout, " layout of a global length ", global, " over ", ctx.comm->size(),
             " ranks gives it ", rows, " (ringattn.shard cuts them)");
}

}  // namespace

CallerComm caller_comm_of(nb::handle comm) {
  if (nb::isinstance<NcclComm>(comm)) {
    const NcclComm& nccl = nb::cast<const NcclComm&>(comm);
    return {MPI_COMM_NULL, nb::handle(), nccl.comm, nccl.device};
  }
  if (is_python_communicator(comm)) return {MPI_COMM_NULL, comm};
  RA_CHECK(nb::hasattr(comm, "py2f"), "comm is a ", nb::cast<std::string>(nb::handle(comm.type()).attr("__name__")),
           ", expected an mpi4py communicator (mpi4py.MPI.Comm) or an object with ring_shift (see ringattn.torch)");
  int initialized = 0;
  MPI_Initialized(&initialized);
  RA_CHECK(initialized, "MPI is not initialized: import mpi4py.MPI first");
  return {MPI_Comm_f2c(nb::cast<int>(comm.attr("py2f")())), nb::handle()};
}

std::string ring_options_text(const AttentionParams& params, const AttentionInputs& in) {
  std::string text = params.describe() + " dtype=" + std::string(dtype_name(in.q.dtype()));
  for (auto [name, dim] : {std::pair{"B", in.q.dim(0)}, {"Hq", in.q.dim(2)}, {"Hkv", in.k.dim(2)}, {"D", in.q.dim(3)},
                           {"Dv", in.v.dim(3)}})
    text += std::string(" ") + name + "=" + std::to_string(dim);
  for (auto [name, given] : {std::pair{"bias", in.bias.defined()}, {"mask", in.mask.defined()},
                             {"sinks", in.sinks.defined()}, {"segment_ids", in.q_segment_ids.defined()}})
    if (given) text += std::string(" ") + name;
  return text;
}

CallRing::CallRing(std::unique_ptr<Communicator> comm, const RingConfig& config)
    : communicator(std::move(comm)), config(config) {
  ctx.comm = communicator.get();
  if (config.backend == Backend::kCuda) {
    use_device_ring(*communicator, ctx, nccl);
    if (nccl) ctx.comm = nccl.get();
  }
  build();
}

CallRing::CallRing(CallerNccl caller, const RingConfig& config) : caller_nccl(std::move(caller.comm)), config(config) {
  ctx.comm = caller_nccl.get();  // no host communicator: the ring moves its blocks over NCCL
  build();
}

void CallRing::build() {
  ctx.layout = parse_layout(config.layout);
  ctx.global_q_len = config.global_q_len;
  ctx.global_kv_len = config.global_kv_len;
  ctx.local_impl = config.local_impl;
  ctx.step_timeout = std::chrono::milliseconds(config.timeout_ms);
  ctx.deterministic = config.deterministic;
  ctx.gradient_wire = config.gradient_wire;
  impl = AttentionRegistry::builtin().create("ring", config.backend, &ctx);
  pos = ring_positions(ctx);
}

void check_ring_call(const CallerComm& caller, const Placement& where, const std::string& layout, double timeout_s) {
  RA_CHECK(timeout_s > 0, "timeout is ", timeout_s, " s, expected a positive number of seconds");
  (void)parse_layout(layout);
  if (caller.nccl) {  // a ringattn.NcclComm: CUDA arrays on its device
    RA_CHECK(where.on_device(), "comm is a ringattn.NcclComm, which carries CUDA arrays; q is in ", where.str(),
             " (host arrays go over an mpi4py communicator or a torch.distributed group)");
    RA_CHECK(where.device == caller.nccl_device, "q is on CUDA device ", where.device,
             " but comm (a ringattn.NcclComm) was made on device ", caller.nccl_device);
  } else if (caller.python.is_valid()) {
    RA_CHECK(!where.on_device(), "ring_attention on CUDA arrays needs comm to be an mpi4py communicator "
             "(under mpirun) or a ringattn.NcclComm (under torchrun: ringattn.torch makes one for a group); an object "
             "with ring_shift carries host arrays only");
  }
}

CallerAgreement::CallerAgreement(const CallerComm& caller, double timeout_s) {
  // A refusing rank's own timeout may be the bad argument: it waits the default then.
  const auto timeout = std::chrono::milliseconds(int64_t((timeout_s > 0 ? timeout_s : 60.0) * 1000));
  if (caller.nccl) {  // over the ringattn.NcclComm's NCCL communicator itself, on its device
    all_reduce = [nccl = caller.nccl, device = caller.nccl_device](int64_t* v, size_t n, ReduceOp op) {
      const ScopedCudaDevice on(device);
      nccl->all_reduce(v, n, op);
    };
    rank = caller.nccl->rank(), size = caller.nccl->size();
  } else if (caller.python.is_valid()) {  // carried by Python: made for this call
    python = std::make_unique<PythonCommunicator>(caller.python);
    all_reduce = [comm = python.get()](int64_t* v, size_t n, ReduceOp op) { comm->all_reduce(v, n, op); };
    rank = python->rank(), size = python->size();
  } else {
    all_reduce = [mpi = caller.mpi, timeout](int64_t* v, size_t n, ReduceOp op) {
      mpi_all_reduce_within(mpi, v, n, op, timeout, "ring_attention: an agreement of the ranks before the ring");
    };
    RA_MPI_CHECK(MPI_Comm_rank(caller.mpi, &rank));
    RA_MPI_CHECK(MPI_Comm_size(caller.mpi, &size));
  }
}

void CallerAgreement::agree_to_start(const std::exception_ptr& refused, int64_t (&least)[2]) const {
  agree_every_rank_goes_on(all_reduce, rank, size, refused, "ring_attention", least);
}

void refuse_ring_call(const CallerComm& caller, double timeout_s, const std::exception_ptr& refused) {
  try {
    int64_t unread[2] = {0, 0};
    CallerAgreement(caller, timeout_s).agree_to_start(refused, unread);
  } catch (...) {  // a communicator this rank cannot reach (the caller raises `refused`)
  }
}

RingForCall::RingForCall(const CallerComm& caller, const std::string& layout, std::optional<int64_t> global_q_len,
                         std::optional<int64_t> global_kv_len, const std::string& local_impl, double timeout_s,
                         const RingModes& modes, const AttentionInputs& in, const CallDevice& device,
                         const std::exception_ptr& refused) {
  CallerAgreement agreement(caller, timeout_s);
  const AgreementAllReduce& agree = agreement.all_reduce;
  // Every rank passes the same options, as the CLI's ranks the same command line: compared before the ring is
  // used, so a rank with others (causal on one rank only) stops every rank alike instead of computing its rows.
  // Compared in the same all-reduce that tells every rank whether one refused its arguments.
  const auto given = [](std::optional<int64_t> length) { return length ? std::to_string(*length) : "the sum"; };
  const std::string mine = refused ? std::string() : modes.options + " layout=" + layout + " local_impl=" +
                           local_impl + " deterministic=" + std::to_string(modes.deterministic) + " grad_wire=" +
                           std::string(dtype_name(modes.gradient_wire)) + " global_q_len=" + given(global_q_len) +
                           " global_kv_len=" + given(global_kv_len);
  const int64_t fingerprint = crc32_bytes(mine.data(), mine.size());
  int64_t least[2] = {fingerprint, -fingerprint};  // the least and (negated) the greatest over the ranks
  agreement.agree_to_start(refused, least);
  if (refused) std::rethrow_exception(refused);
  RA_CHECK(least[0] == fingerprint && least[1] == -fingerprint, "the ranks called the ring with different options "
           "(this is one of them: ", mine, "); every rank passes the same options, layout, implementation and head "
           "shapes");
  RingConfig config{layout,        local_impl,          0, 0, in.q.dim(1), in.k.dim(1), int64_t(timeout_s * 1000),
                    device.backend(), device.where.device, modes.deterministic, modes.gradient_wire};
  int64_t lengths[2] = {in.q.dim(1), in.k.dim(1)};
  if (!global_q_len || !global_kv_len) agree(lengths, 2, ReduceOp::kSum);
  config.global_q_len = global_q_len.value_or(lengths[0]), config.global_kv_len = global_kv_len.value_or(lengths[1]);
  const auto min_over_ranks = [&](int64_t* v) { agree(v, 2, ReduceOp::kMin); };
  if (agreement.python) {
    owned_ = std::make_unique<CallRing>(std::move(agreement.python), config);
    ring_ = owned_.get();
  } else if (caller.nccl) {
    keep_or_build(find_kept(caller.nccl.get(), config), min_over_ranks,
                  [&] { return std::make_unique<CallRing>(CallRing::CallerNccl{caller.nccl}, config); });
  } else {
    keep_or_build(find_kept(caller.mpi, config), min_over_ranks,
                  [&] { return std::make_unique<CallRing>(std::make_unique<MpiCommunicator>(caller.mpi), config); });
  }
  device.bind(*ring_->impl);
  try {
    check_shard_rows(*ring_, in);
  } catch (...) {
    ring_->impl->refuse_call(std::current_exception());  // the other ranks are at the call's start
    drop();
    throw;
  }
}

void RingForCall::keep_or_build(CallRing* found, const std::function<void(int64_t*)>& min_over_ranks,
                                const std::function<std::unique_ptr<CallRing>()>& build) {
  int64_t every_rank[2] = {found != nullptr, 0};  // holds a kept ring for this configuration; has room for one
  {
    std::lock_guard<std::mutex> lock(kept().mutex);
    every_rank[1] = kept().rings.size() < kKeptRings;
  }
  min_over_ranks(every_rank);
  if (every_rank[0]) {
    ring_ = found;
    return;
  }
  if (found != nullptr) forget_kept(found);  // kept here only: the ranks' kept rings differ after a failure
  std::unique_ptr<CallRing> ring = build();
  ring_ = ring.get();
  if (every_rank[1]) {
    std::lock_guard<std::mutex> lock(kept().mutex);
    kept().rings.push_back(std::move(ring));
  } else {
    owned_ = std::move(ring);
  }
}

void RingForCall::drop() {
  if (owned_) {
    (void)owned_.release();  // its destructor is collective and the peers may have failed
  } else {
    forget_kept(ring_);
  }
}

void release_kept_rings() {
  std::deque<std::unique_ptr<CallRing>> rings;
  {
    std::lock_guard<std::mutex> lock(kept().mutex);
    rings.swap(kept().rings);
  }
  while (!rings.empty()) rings.pop_front();  // in the order they were made, as on every rank
}

namespace {
// The process's, not the thread's: PyTorch runs a backward on its own threads.
struct LastStats {
  std::mutex mutex;
  std::optional<RingStats> stats;
};
LastStats& last_stats() {
  static LastStats* last = new LastStats;  // never destroyed: read until the process ends
  return *last;
}
}  // namespace

void remember_stats(const CallRing& ring) {
  const RingStats* stats = nullptr;
#if RA_HAVE_CUDA
  if (const auto* gpu = dynamic_cast<const RingAttentionCuda*>(ring.impl.get())) stats = &gpu->last_stats();
#endif
  if (const auto* host = dynamic_cast<const RingAttention*>(ring.impl.get())) stats = &host->last_stats();
  if (stats == nullptr) return;
  std::lock_guard<std::mutex> lock(last_stats().mutex);
  last_stats().stats = *stats;
}

std::optional<RingStats> last_ring_stats() {
  std::lock_guard<std::mutex> lock(last_stats().mutex);
  return last_stats().stats;
}

size_t kept_ring_count() {
  std::lock_guard<std::mutex> lock(kept().mutex);
  return kept().rings.size();
}

}  // namespace ra::python
