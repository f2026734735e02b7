// The GPU ring's kernels without its transfers, on one GPU: the local flash kernel folds the N blocks
// that rank r of an N-rank ring folds (the same query and key positions, the same skipped blocks) into
// one carry, back to back on one stream as the ring queues them, beside one kernel over the whole
// sequence. Shows what the ring's compute costs when transfers are free, and what the operations the
// ring puts between its kernels (an event record, with or without timing, a wait on another stream's
// event) cost when each kernel may start on the SMs the previous one leaves idle. Variants run in
// interleaved rounds; the median of each is printed.
//   ring_chain_gpu_bench --ranks 4 [--rank 0] --seq 32768 [--heads 32] [--head-dim 128] [--causal]
//                        [--layout zigzag] [--iters 20]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/ring/ring_schedule.h"
#include "attention/carry.h"
#include "attention/cuda/cuda_attention.h"
#include "attention/registry.h"
#include "attention/ring/ring.h"
#include "mesh/sequence_layout.h"
#include "runtime/cuda_device.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace ra {
namespace {

struct Options {
  int ranks = 4, rank = 0, iters = 20;
  int64_t seq = 32768, heads = 32, head_dim = 128;
  bool causal = false;
  std::string layout = "zigzag";
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&] {
      RA_CHECK(i + 1 < argc, flag, " needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--ranks") o.ranks = std::stoi(value());
    else if (flag == "--rank") o.rank = std::stoi(value());
    else if (flag == "--seq") o.seq = std::stoll(value());
    else if (flag == "--heads") o.heads = std::stoll(value());
    else if (flag == "--head-dim") o.head_dim = std::stoll(value());
    else if (flag == "--iters") o.iters = std::stoi(value());
    else if (flag == "--layout") o.layout = value();
    else if (flag == "--causal") o.causal = true;
    else RA_FAIL("unknown option '", flag, "' (see the comment at the top of ring_chain_gpu_bench.cc)");
  }
  RA_CHECK(o.ranks >= 1 && o.rank >= 0 && o.rank < o.ranks, "--rank ", o.rank, " is not a rank of --ranks ", o.ranks);
  RA_CHECK(o.iters >= 1, "--iters must be positive");
  return o;
}

// What the ring places on the compute stream between two of its kernels.
enum class Between { kNothing, kRecord, kTimedRecord, kWait, kRecordAndWait };

struct Variant {
  const char* name;
  bool overlap;  // kernels after the first launched as dependents of the previous one
  Between between;
};

class Chain {
 public:
  Chain(const Options& o, cudaStream_t stream)
      : o_(o), stream_(stream), local_len_(o.seq / o.ranks), schedule_(parse_layout(o.layout), o.seq, o.seq, o.ranks, o.rank) {
    RA_CHECK(o.seq % (2 * o.ranks) == 0, "--seq ", o.seq, ": this bench splits it into 2 x --ranks equal chunks");
    params_.causal = o.causal;
    std::mt19937_64 rng(7);
    Tensor q = random_normal(DType::kBF16, {1, local_len_, o.heads, o.head_dim}, rng);
    Tensor k = random_normal(DType::kBF16, {1, local_len_, o.heads, o.head_dim}, rng);
    Tensor v = random_normal(DType::kBF16, {1, local_len_, o.heads, o.head_dim}, rng);
    AttentionInputs host;
    host.q = q, host.k = k, host.v = v;
    inputs_ = copy_inputs(host, MemoryKind::kCuda);
    carry_ = Carry::empty(1, o.heads, local_len_, o.head_dim, MemoryKind::kCuda);
    // One upload: this rank's query positions, then every rank's key positions (as the ring does).
    TokenPositions all;
    all.q = schedule_.query_positions();
    all.k = schedule_.all_keys();
    all.total_keys = o.seq;
    positions_ = upload_.upload(all, stream_);
    positions_.keys_sorted = schedule_.keys_sorted();
    local_ = make_local();
  }

  // Milliseconds for the ring's kernels of one call (carry reset outside the timing).
  float run(const Variant& variant) {
    reset(carry_, stream_);
    begin_.record(stream_);
    bool after_kernel = false;
    for (int step = 0; step < o_.ranks; ++step) {
      const int src = schedule_.source(step);
      if (step > 0 && (variant.between == Between::kRecord || variant.between == Between::kRecordAndWait))
        compute_done_.record(stream_);
      if (step > 0 && variant.between == Between::kTimedRecord) timed_done_.record(stream_);
      if (step > 0 && (variant.between == Between::kWait || variant.between == Between::kRecordAndWait))
        RA_CUDA_CHECK(cudaStreamWaitEvent(stream_, other_done_.get(), 0));
      if (schedule_.skipped(src, params_)) continue;
      DevicePositions pos = positions_.keys_from(schedule_.key_offset(src));  // as the GPU ring's steps
      pos.q_host = schedule_.query_positions().data(), pos.k_host = schedule_.keys(src).data();
      local_->set_after_carry_writer(variant.overlap && after_kernel);
      local_->accumulate_device(inputs_.inputs, pos, params_, carry_);
      after_kernel = true;
    }
    end_.record(stream_);
    RA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return end_.milliseconds_since(begin_);
  }

  void prepare_other_stream(cudaStream_t other) {  // an event on another stream, complete long before
    other_done_.record(other);
    RA_CUDA_CHECK(cudaStreamSynchronize(other));
  }

  double flops() const {
    const double f = 4.0 * double(o_.heads) * double(o_.seq) * double(o_.seq) * double(o_.head_dim) / o_.ranks;
    return o_.causal ? f / 2 : f;
  }

 private:
  std::unique_ptr<CudaAttentionImpl> make_local() const {
    std::unique_ptr<AttentionImpl> impl = AttentionRegistry::builtin().create("flash_attn2", Backend::kCuda);
    std::unique_ptr<CudaAttentionImpl> local(dynamic_cast<CudaAttentionImpl*>(impl.release()));
    RA_CHECK(local != nullptr, "flash_attn2 has no device implementation in this build");
    local->set_cuda_stream(stream_);
    return local;
  }

  const Options& o_;
  cudaStream_t stream_;
  int64_t local_len_;
  AttentionParams params_;
  InputsCopy inputs_;
  Carry carry_;
  RingSchedule schedule_;
  DevicePositionBuffer upload_;
  DevicePositions positions_;
  std::unique_ptr<CudaAttentionImpl> local_;
  CudaEvent begin_{true}, end_{true}, timed_done_{true}, compute_done_, other_done_;
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run_bench(const Options& o) {
  RA_CHECK(cuda_device_count() > 0, "ring_chain_gpu_bench needs a GPU");
  CudaStream stream, other;
  Options whole_options = o;
  whole_options.ranks = 1, whole_options.rank = 0;
  Chain chain(o, stream.get()), whole(whole_options, stream.get());
  chain.prepare_other_stream(other.get());
  const std::vector<Variant> variants = {{"serial", false, Between::kNothing},
                                         {"overlap", true, Between::kNothing},
                                         {"overlap, record between", true, Between::kRecord},
                                         {"overlap, timing event between", true, Between::kTimedRecord},
                                         {"overlap, wait between", true, Between::kWait},
                                         {"overlap, record and wait", true, Between::kRecordAndWait}};
  std::vector<std::vector<float>> times(variants.size());
  std::vector<float> whole_times;
  for (int warm = 0; warm < 2; ++warm) {
    whole.run(variants[0]);
    for (const Variant& v : variants) chain.run(v);
  }
  for (int it = 0; it < o.iters; ++it) {
    whole_times.push_back(whole.run(variants[0]));
    for (size_t i = 0; i < variants.size(); ++i) times[i].push_back(chain.run(variants[i]));
  }
  const float whole_ms = median(whole_times);
  const double whole_tflops = whole.flops() / (whole_ms * 1e-3) * 1e-12;
  std::printf("# bf16 B=1 H=%ld D=%ld T=%ld causal=%d layout=%s; kernels of rank %d of %d, %d iterations\n",
              long(o.heads), long(o.head_dim), long(o.seq), int(o.causal), o.layout.c_str(), o.rank, o.ranks, o.iters);
  std::printf("%-28s %9.3f ms %8.1f TFLOP/s\n", "one kernel, whole sequence", whole_ms, whole_tflops);
  for (size_t i = 0; i < variants.size(); ++i) {
    const float ms = median(times[i]);
    const double tflops = chain.flops() / (ms * 1e-3) * 1e-12;
    std::printf("%-28s %9.3f ms %8.1f TFLOP/s %6.1f%%\n", variants[i].name, ms, tflops, 100 * tflops / whole_tflops);
  }
  return 0;
}

}  // namespace
}  // namespace ra

int main(int argc, char** argv) {
  try {
    return ra::run_bench(ra::parse_options(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ring_chain_gpu_bench: %s\n", e.what());
    return 1;
  }
}
