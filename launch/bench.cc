// `ringattn bench`: synthetic shards on every rank, the chosen implementation timed over several
// iterations (median of the slowest rank), an exchange-only ring for the same bytes, and one
// nccl-tests style row: time, GFLOP/s per rank, and the share of communication hidden by compute.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "attention/ring/ring.h"
#include "attention/validate.h"
#if RA_HAVE_CUDA
#include "attention/ring/ring_cuda.h"
#endif
#include "attention/registry.h"
#include "launch/bench_backward.h"
#include "launch/bench_documents.h"
#include "launch/bench_extras.h"
#include "launch/bench_timing.h"
#include "launch/commands.h"
#include "launch/option_scope.h"
#include "launch/output_path.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace ra::cli {
namespace {

// "1.23 4.56 7.89"
std::string joined(const std::vector<float>& values) {
  std::string text;
  char item[32];
  for (float v : values) {
    std::snprintf(item, sizeof(item), "%s%.2f", text.empty() ? "" : " ", double(v));
    text += item;
  }
  return text;
}

}  // namespace

int cmd_bench(int argc, char** argv, const MpiSession& mpi) {
  AttentionOptions opts;
  int64_t batch = 1, seq = 0, heads = 0, kv_heads = 0, head_dim = 0, v_head_dim = 0, iters = 5, warmup = 1, segments = 0;
  std::string dtype_text = "f32", json_path;
  bool step_times = false, backward = false, bias = false, mask = false, mask_documents = false, mask_named = false;
  bool f32_gradients = false;
  std::string grad_wire = "f32";
  po::options_description desc("ringattn bench");
  desc.add_options()("help", "this text")
    ("batch", po::value(&batch)->default_value(1), "B")
    ("seq", po::value(&seq)->required(), "T = S, the global sequence length")
    ("heads", po::value(&heads)->required(), "Hq")
    ("kv-heads", po::value(&kv_heads), "Hkv (default Hq)")
    ("head-dim", po::value(&head_dim)->required(), "D, of q and k")
    ("v-head-dim", po::value(&v_head_dim), "Dv, of v and O (default D)")
    ("dtype", po::value(&dtype_text)->default_value("f32"), "f32 | f16 | bf16")
    ("iters", po::value(&iters)->default_value(5), "timed iterations (median reported)")
    ("warmup", po::value(&warmup)->default_value(1), "untimed iterations first")
    ("json", po::value(&json_path), "also write the row as JSON to this file")
    ("segments", po::value(&segments)->default_value(0), "pack N documents of equal length (segment ids, as generate "
     "--segments writes them); TFLOP/s count the pairs inside documents only")
    ("bias", po::bool_switch(&bias), "an additive f32 bias, one (T, S) matrix broadcast over batch and heads")
    ("mask", po::bool_switch(&mask), "a boolean mask, one (T, S) matrix broadcast over batch and heads, 7 / 8 of "
     "its pairs kept (TFLOP/s count every pair)")
    ("mask-documents", po::bool_switch(&mask_documents), "with --segments N: the documents as a boolean mask (each "
     "query keeping its own document's keys) instead of segment ids, as Transformers' dense masks and Llama 4's "
     "chunked attention give them")
    ("mask-named", po::bool_switch(&mask_named), "with a mask: name it (AttentionInputs::mask_identity, as "
     "ringattn.torch names a tensor by its version), so that the GPU kernels summarise it at the first (untimed) call "
     "and keep the summary, as a model's layers and each forward's backward share one mask; without it every call "
     "reads the whole mask to summarise it")
    ("backward", po::bool_switch(&backward), "time a training step's attention: forward, backward (given the "
     "forward's O and LSE) and both, per rank; the ring on N ranks (host or GPU), or one rank's local implementation")
    ("grad-wire", po::value(&grad_wire)->default_value("f32"), kGradWireHelp)
    ("f32-gradients", po::bool_switch(&f32_gradients), "with --backward: dq, dk, dv in f32 (the local kernels then add "
     "into f32 accumulators, as the ring's steps do, instead of writing the input dtype)")
    ("step-times", po::bool_switch(&step_times), "ring on GPUs: time each step with CUDA events (they keep each "
     "step's kernel from starting before the previous one ends, so the ring runs a little slower); with "
     "--backward, every rank's computes, adds, transfers and waits of the last iteration");
  add_attention_options(desc, opts, AttentionRegistry::builtin().list_implementations());
  if (!parse(argc, argv, desc, "Usage: mpirun -np N ringattn bench --seq T --heads H --head-dim D [options]", nullptr,
             &opts.given))
    return kOk;
  check_options_apply(opts);
  if (kv_heads == 0) kv_heads = heads;
  if (v_head_dim == 0) v_head_dim = head_dim;
  for (auto [v, name] : {std::pair{batch, "batch"}, {seq, "seq"}, {heads, "heads"}, {kv_heads, "kv-heads"},
                         {head_dim, "head-dim"}, {v_head_dim, "v-head-dim"}, {iters, "iters"}})
    positive(v, name);
  RA_CHECK(warmup >= 0, "--warmup is ", warmup, ", expected 0 or more");
  RA_CHECK(segments >= 0 && segments <= seq, "--segments ", segments, " must be between 0 and --seq ", seq);
  RA_CHECK(!mask_documents || (segments > 0 && !mask), "--mask-documents turns --segments N's documents into a mask: it "
           "needs --segments and takes no --mask");
  RA_CHECK(!mask_named || mask || mask_documents, "--mask-named names the call's mask: it needs --mask or --mask-documents");
  RA_CHECK(!mask_named || opts.backend == "cuda", "--mask-named: only the GPU kernels summarise a mask (--backend cuda); "
           "the host kernels read its bytes block by block in every call");
  if (!json_path.empty()) check_output_path(json_path, "", /*overwrite=*/true, "--json");  // before the bench runs
  RA_CHECK(heads % kv_heads == 0, "--heads ", heads, " is not a multiple of --kv-heads ", kv_heads);
  const DType dtype = parse_dtype(dtype_text);
  const AttentionParams params = to_params(opts);
  Job job(opts, mpi, args_text(argc, argv));
  check_backward_options_apply(opts, backward, {"grad-wire", "f32-gradients"});
  if (backward) {
    RA_CHECK(json_path.empty(), "--json applies to the forward bench, not --backward");
    return bench_backward(BackwardBenchShape{batch, seq, heads, kv_heads, head_dim, v_head_dim, iters, warmup, dtype,
                                             parse_gradient_wire(grad_wire, "--grad-wire"), segments, bias, mask,
                                             step_times, f32_gradients, mask_documents, mask_named},
                          opts, job);
  }
  const int rank = job.world.rank();
  RA_CHECK(job.shape.axis_count() == 1 && job.shape.has_axis("sp"), "bench runs on a pure sp mesh (got ", job.shape.str(), ")");
  RingContext ctx;
  ctx.time_steps = step_times;  // the GPU ring's per-step device times, printed below
  auto impl = make_impl(opts, job, seq, seq, ctx);
  const TokenPositions pos = impl->name() == "ring" ? ring_positions(ctx) : TokenPositions::dense(seq, seq);
  const int n = ctx.comm->size();
  // Any --seq on any number of ranks: shards differ by a row where it does not divide.
  const int64_t local = int64_t(pos.q.size()), local_kv = int64_t(pos.k.size());
  std::mt19937_64 rng(1000 + uint64_t(rank));
  Tensor q = random_normal(dtype, {batch, local, heads, head_dim}, rng);
  Tensor k = random_normal(dtype, {batch, local_kv, kv_heads, head_dim}, rng);
  Tensor v = random_normal(dtype, {batch, local_kv, kv_heads, v_head_dim}, rng);
  AttentionInputs in;
  in.q = q;
  in.k = k;
  in.v = v;
  Tensor q_segments, kv_segments;
  const Tensor documents = mask_documents ? document_mask(pos.q, seq, segments) : Tensor();
  in.mask = documents;
  if (segments > 0 && !mask_documents) {
    q_segments = packed_segment_ids(batch, pos.q, seq, segments);
    kv_segments = packed_segment_ids(batch, pos.k, seq, segments);
    in.q_segment_ids = q_segments;
    in.kv_segment_ids = kv_segments;
  }
  const Tensor bias_matrix = bias ? bench_bias(local, seq, rng) : Tensor();
  const Tensor mask_matrix = mask ? bench_mask(local, seq, rng) : Tensor();
  in.bias = bias_matrix;
  if (mask) in.mask = mask_matrix;

  // Everything the timed loop touches is allocated once: inputs (on the device for cuda), the carry
  // and the outputs. One iteration = reset the carry, accumulate, finalize O and LSE.
  const InputsCopy staged = job.on_device ? copy_inputs(in, MemoryKind::kCuda) : InputsCopy{};
  AttentionInputs run_in = job.on_device ? staged.inputs : in;
  run_in.mask_identity = mask_named ? kBenchMaskName : 0;
  validate_attention(run_in, params, pos, impl->max_head_dim());
  Carry carry = Carry::empty(batch, heads, local, v_head_dim, job.memory());
  Tensor o(dtype, {batch, local, heads, v_head_dim}, job.memory()), lse(DType::kF32, {batch, heads, local}, job.memory());
  IterationTimer timer(job);
  std::vector<double> times, waits, own_times;
  for (int64_t it = 0; it < warmup + iters; ++it) {
    job.world.barrier();
    timer.start();
    reset(carry, job.stream());
    impl->accumulate(run_in, pos, params, carry);
    finalize(carry, TensorView(), o, lse, job.stream());
    double t = timer.stop_seconds();
    const RingStats* stats = ring_stats(*impl);
    double w = stats ? stats->wait_seconds : 0.0;
    if (it >= warmup) own_times.push_back(t);
    job.world.all_reduce(&t, 1, ReduceOp::kMax);
    job.world.all_reduce(&w, 1, ReduceOp::kMax);
    if (it >= warmup) {
      times.push_back(t);
      waits.push_back(w);
    }
  }
  // The same N-1 exchanges with nothing to hide them behind.
  int64_t block_bytes = int64_t(k.view().nbytes() + v.view().nbytes());
  job.world.all_reduce(&block_bytes, 1, ReduceOp::kMax);  // the ring sends blocks of the longest shard
  // Between buffers of the memory the communicator carries: an MPI axis (ranks sharing a GPU, whose ring
  // moves its blocks over copy engines) takes host memory, not device pointers.
  const MemoryKind comm_memory = job.on_device && !ctx.comm->carries_device_memory() ? MemoryKind::kPinned : job.memory();
  Tensor a(DType::kU8, {block_bytes}, comm_memory), b(DType::kU8, {block_bytes}, comm_memory);
  std::vector<double> comm_times;
  for (int64_t it = 0; it < std::max<int64_t>(iters, 3); ++it) {
    job.world.barrier();
    double t0 = now_seconds();
    for (int s = 0; s + 1 < n; ++s) ctx.comm->ring_shift(a.data<char>(), b.data<char>(), size_t(block_bytes), s)->wait(ctx.step_timeout);
    double t = now_seconds() - t0;
    job.world.all_reduce(&t, 1, ReduceOp::kMax);
    comm_times.push_back(t);
  }
  // Device memory after the timed loop: inputs, carry, outputs and the ring's grow-only buffers are
  // all still held, so this is their peak (with the CUDA context and NCCL's buffers); largest rank.
  double device_gib = 0;
#if RA_HAVE_CUDA
  if (job.on_device) device_gib = double(cuda_bytes_in_use()) / double(1 << 30);
#endif
  job.world.all_reduce(&device_gib, 1, ReduceOp::kMax);
  const double time = median(times), wait = median(waits), comm = median(comm_times);
  const double flops = attention_flops(batch, heads, attended_pairs(seq, segments, params.causal), head_dim, v_head_dim) / n;
  // With --step-times, every rank's own device times: which rank sets the pace, and how much of its
  // time is outside its kernels (carry reset, the wait for the first kernel, finalize).
  const RingStats* ring = ring_stats(*impl);
  const bool per_rank = ring && !ring->step_compute_ms.empty();
  // The share of the exchanges hidden behind compute. On the host: the exchange time the ring did not
  // spend blocked. On GPUs (the host does not wait for the device there) from the device times of
  // --step-times: the compute stream's gaps between kernels are the exposed part of the exchanges,
  // the slowest rank's; without them it is not measured ("-").
  double hidden = NAN;
  if (!job.on_device) {
    hidden = comm > 0 ? std::clamp(1.0 - wait / comm, 0.0, 1.0) : 1.0;
  } else if (per_rank || n == 1) {
    double exchanged = 0, kernels = 0;
    if (per_rank) {
      for (float ms : ring->step_exchange_ms) exchanged += ms;
      for (float ms : ring->step_compute_ms) kernels += ms;
    }
    const double gaps = per_rank ? std::max(0.0, double(ring->ring_ms) - kernels) : 0.0;
    hidden = exchanged > 0 ? std::clamp(1.0 - gaps / exchanged, 0.0, 1.0) : 1.0;
    job.world.all_reduce(&hidden, 1, ReduceOp::kMin);
  }
  // Uneven shards and causal masks give ranks different work: visible (query, key) pairs per rank,
  // the busiest against the mean (1.00 = balanced).
  double pairs = 0;
  for (int64_t p : pos.q) {
    // The keys of p's document: [first, end) (all of them without documents).
    const int64_t doc = segments > 0 ? p * segments / seq : 0, per = std::max<int64_t>(segments, 1);
    const int64_t first = (doc * seq + per - 1) / per, end = ((doc + 1) * seq + per - 1) / per;
    pairs += params.causal ? double(std::min(p + 1, end) - first) : double(end - first);
  }
  double most = pairs, all_pairs = pairs;
  job.world.all_reduce(&most, 1, ReduceOp::kMax);
  job.world.all_reduce(&all_pairs, 1, ReduceOp::kSum);
  const double imbalance = all_pairs > 0 ? most / (all_pairs / n) : 1.0;
  std::vector<double> rank_rows(4 * size_t(n));
  if (per_rank) {
    double kernels = 0;
    for (float ms : ring->step_compute_ms) kernels += ms;
    const double mine[4] = {median(own_times) * 1e3, ring->ring_ms, kernels, ring->host_before_first_kernel_ms};
    job.world.all_gather(mine, rank_rows.data(), sizeof(mine));
  }
  if (rank == 0) {
    std::printf("#%11s %8s %6s %5s %8s %4s %4s %4s %5s %6s %10s %11s %12s %10s %7s\n", "impl", "backend", "ranks", "B",
                "T", "Hq", "Hkv", "D", "dtype", "causal", "layout", "time(ms)", "GFLOP/s/rank", "comm(ms)", "hidden");
    // A single call's local kernel has no layout: its one rank holds every token.
    const char* layout_shown = ring ? layout_name(ctx.layout) : "-";
    char hidden_text[16] = "      -";
    if (!std::isnan(hidden)) std::snprintf(hidden_text, sizeof(hidden_text), "%6.0f%%", hidden * 100);
    std::printf(" %11s %8s %6d %5ld %8ld %4ld %4ld %4s %5s %6d %10s %11.2f %12.2f %10.3f %s\n",
                std::string(impl->name()).c_str(), opts.backend.c_str(), n, long(batch), long(seq), long(heads),
                long(kv_heads), head_dims_text(head_dim, v_head_dim).c_str(), dtype_text.c_str(), int(params.causal), layout_shown,
                time * 1e3, flops / time * 1e-9, comm * 1e3, hidden_text);
    if (n > 1) {
      int64_t fewest = seq;
      for (int r = 0; r < n; ++r) fewest = std::min(fewest, layout_rows(ctx.layout, seq, n, r));
      std::printf("  work per rank: the busiest rank has %.3fx the mean (visible query-key pairs; shards of %ld..%ld "
                  "tokens)\n", imbalance, long(fewest), long(layout_max_rows(ctx.layout, seq, n)));
    }
    if (job.on_device && std::isnan(hidden))
      std::printf("  hidden: not measured on GPUs without --step-times (the device times of the steps give it)\n");
    if (job.on_device) std::printf("  device memory in use on the busiest rank: %.2f GiB (CUDA context and NCCL included)\n", device_gib);
    if (ring && n > 1)  // comm(ms) above times the communicator's own shifts, whatever moved the ring's blocks
      std::printf("  ring transport: %s%s\n", ring->transport.c_str(),
                  ring->transport == ctx.comm->backend_name() ? "" : " (comm(ms) times the communicator's shifts)");
    if (ring && !ring->step_compute_ms.empty()) {  // rank 0's last iteration, device times
      float kernels = 0;
      for (float ms : ring->step_compute_ms) kernels += ms;
      std::printf("  ring steps on rank 0 (ms): kernels %s | exchanges %s | first kernel start to last end %.2f, of "
                  "which between kernels %.2f | host: call to first kernel queued %.3f\n",
                  joined(ring->step_compute_ms).c_str(), joined(ring->step_exchange_ms).c_str(),
                  double(ring->ring_ms), double(ring->ring_ms - kernels), ring->host_before_first_kernel_ms);
    }
    for (int r = 0; per_rank && r < n; ++r) {
      const double* row = &rank_rows[4 * size_t(r)];
      std::printf("  rank %d (ms): time %.3f, first kernel start to last end %.3f (kernels %.3f), outside it %.3f, "
                  "host: call to first kernel %.3f\n", r, row[0], row[1], row[2], row[0] - row[1], row[3]);
    }
    if (!json_path.empty()) {
      nlohmann::json row = {{"impl", impl->name()}, {"local_impl", ring ? nlohmann::json(opts.local_impl) : nlohmann::json()}, {"backend", opts.backend},
                            {"ranks", n}, {"batch", batch}, {"seq", seq}, {"heads", heads}, {"kv_heads", kv_heads},
                            {"head_dim", head_dim}, {"v_head_dim", v_head_dim}, {"dtype", dtype_text}, {"causal", params.causal},
                            {"layout", ring ? nlohmann::json(layout_name(ctx.layout)) : nlohmann::json()}, {"time_s", time}, {"gflops_per_rank", flops / time * 1e-9},
                            {"comm_s", comm}, {"device_gib", device_gib},
                            {"transport", ring && n > 1 ? ring->transport : ""}, {"hidden_fraction", std::isnan(hidden) ? nlohmann::json() : nlohmann::json(hidden)},
                            {"work_imbalance", imbalance}, {"times_s", times}};
      std::ofstream json(json_path);
      json << row.dump(2) << "\n";
      json.close();
      RA_CHECK(json.good(), "--json: writing '", json_path, "' failed (disk full?)");
    }
  }
  return kOk;
}

}  // namespace ra::cli
