// CPU flash kernel throughput, forward and backward, beside the machine's f32 GEMM rate (OpenBLAS
// sgemm), all measured in this run with the same threads: GFLOP/s (4 B H T S D, half for causal; 2.5x
// that for the backward), medians, and their ratio. The backward's two ways to form dQ (CpuDqStrategy) are
// timed alternately, call by call, beside the default (auto).
// Usage: flash_cpu_bench [T] [H] [D] [--append FILE]   (defaults 4096 8 128)
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "attention/backward.h"
#include "attention/cpu/flash_cpu.h"
#include "attention/registry.h"
#include "runtime/random.h"

extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_config(void);

namespace {

template <typename F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  f();  // warm-up
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t T = 4096, H = 8, D = 128;
  std::string append;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--append") && i + 1 < argc) append = argv[++i];
    else pos.push_back(argv[i]);
  }
  if (pos.size() > 0) T = std::stoll(pos[0]);
  if (pos.size() > 1) H = std::stoll(pos[1]);
  if (pos.size() > 2) D = std::stoll(pos[2]);
  const int threads = omp_get_max_threads();
  openblas_set_num_threads(threads);

  // GEMM reference rate: a square sgemm large enough to reach the machine's peak.
  const int n = 2048;
  std::vector<float> a(size_t(n) * n, 1.0f), b(size_t(n) * n, 0.5f), c(size_t(n) * n);
  const double gemm_s = median_seconds(5, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  const double gemm_gflops = 2.0 * n * n * double(n) / gemm_s * 1e-9;

  std::mt19937_64 rng(1);
  ra::Tensor q = ra::random_normal(ra::DType::kF32, {1, T, H, D}, rng);
  ra::Tensor k = ra::random_normal(ra::DType::kF32, {1, T, H, D}, rng);
  ra::Tensor v = ra::random_normal(ra::DType::kF32, {1, T, H, D}, rng);
  ra::AttentionInputs in;
  in.q = q;
  in.k = k;
  in.v = v;
  auto flash = ra::AttentionRegistry::builtin().create("flash_attn2", ra::Backend::kCpu);
  std::string rows;
  for (bool causal : {false, true}) {
    ra::AttentionParams p;
    p.causal = causal;
    const double s = median_seconds(3, [&] { flash->forward(in, p); });
    const double gflops = 4.0 * H * double(T) * double(T) * D / (causal ? 2 : 1) / s * 1e-9;
    char row[512];
    std::snprintf(row, sizeof row, "| flash_attn2 cpu (%s) | B=1 T=S=%ld H=%ld D=%ld f32 %s | %d | %.3f s | %.1f | %.1f | %.0f%% |\n",
                  ra::cpu_isa_name(ra::best_cpu_isa()), long(T), long(H), long(D), causal ? "causal" : "non-causal",
                  threads, s, gflops, gemm_gflops, 100.0 * gflops / gemm_gflops);
    rows += row;
    // The backward (FlashAttention's count: 2.5x the forward's FLOPs): delta, accumulate_backward and
    // the gradients, from this forward's output.
    const ra::AttentionOutput out = flash->forward(in, p);
    std::mt19937_64 grad_rng(2);
    const ra::Tensor d_o = ra::random_normal(ra::DType::kF32, {1, T, H, D}, grad_rng);
    const double bs = median_seconds(3, [&] { flash->backward(in, p, d_o, &out); });
    auto backward_row = [&](const char* what, double seconds) {
      const double bgflops = 2.5 * 4.0 * H * double(T) * double(T) * D / (causal ? 2 : 1) / seconds * 1e-9;
      std::snprintf(row, sizeof row, "| flash_attn2 cpu backward%s (%s) | B=1 T=S=%ld H=%ld D=%ld f32 %s | %d | %.3f s | %.1f | %.1f | %.0f%% |\n",
                    what, ra::cpu_isa_name(ra::best_cpu_isa()), long(T), long(H), long(D),
                    causal ? "causal" : "non-causal", threads, seconds, bgflops, gemm_gflops, 100.0 * bgflops / gemm_gflops);
      rows += row;
    };
    backward_row("", bs);
    // The two dQ strategies, alternating (each call: delta, zeroed accumulators, the kernel).
    const ra::TokenPositions positions = ra::TokenPositions::dense(T, T);
    const ra::Tensor delta = ra::compute_delta(out.o.view(), d_o.view(), ra::TensorView());
    const ra::BackwardInputs grad{out.lse.view(), d_o.view(), delta.view(), out.o.view()};
    auto run = [&](ra::CpuDqStrategy dq) {
      ra::GradAccumulators acc = ra::GradAccumulators::zeros(in, ra::MemoryKind::kHost);
      ra::flash_accumulate_backward_cpu(in, positions, p, grad, acc.views(), ra::best_cpu_isa(), dq);
    };
    std::vector<double> second_pass, partials;
    run(ra::CpuDqStrategy::kSecondPass);
    run(ra::CpuDqStrategy::kThreadPartials);
    for (int i = 0; i < 5; ++i)
      for (auto [dq, times] : {std::pair{ra::CpuDqStrategy::kSecondPass, &second_pass},
                               std::pair{ra::CpuDqStrategy::kThreadPartials, &partials}}) {
        const auto t0 = std::chrono::steady_clock::now();
        run(dq);
        times->push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    for (std::vector<double>* t : {&second_pass, &partials}) std::sort(t->begin(), t->end());
    backward_row(", dQ second pass", second_pass[2]);
    backward_row(", dQ thread partials", partials[2]);
  }
  std::printf("| kernel | shape | threads | time (median) | GFLOP/s | sgemm %d^3 GFLOP/s | ratio |\n|---|---|---|---|---|---|---|\n%s",
              n, rows.c_str());
  std::printf("OpenBLAS: %s\n", openblas_get_config());
  if (!append.empty()) std::ofstream(append, std::ios::app) << rows;
  return 0;
}
