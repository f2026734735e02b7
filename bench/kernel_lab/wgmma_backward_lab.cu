// The wgmma backward's kernel lab (make_lab.sh builds it for the device; the build compiles it with knob 0 only, as a
// check): times the committed kernel against an experimental copy (exp_kernel.cuh, one instance per compile-time
// knob) on synthetic inputs (B = 1, random Q, K, V, dO, LSE near its true value, positions 0..T-1), interleaved,
// median of `iters` after 2 warm-up calls, and checks each knob's gradients against the committed kernel's (largest
// difference). RA_LAB_BATCH=B: B sequences of T each (the batch form of B documents; default 1).
// A knob that exp_kernel.cuh names in RA_LAB_EXP_PERSISTENT(knob) is launched persistent: one block per SM (or per
// tile where fewer), each claiming its tiles itself; RA_LAB_EXP_SETUP(g, T, D), where exp_kernel.cuh defines it, runs
// once before the kernels (its own maps, say). RA_LAB_CLUSTER=N launches the experimental kernel as clusters of N
// consecutive key blocks. RA_LAB_DQ_APART=1 (D = 192, 256): both the committed and the experimental kernel as the
// library's dQ-apart path runs them (kDqApart: dK and dV only), each followed by the committed query-block dQ kernel.
// Usage: wgmma_backward_lab D H T causal iters knob...
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "attention/cuda/flash_wgmma_backward_kernel.cuh"
#include "attention/cuda/flash_wgmma_dq_kernel.cuh"
#include "runtime/cuda_device.h"
#include "exp_kernel.cuh"
#ifndef RA_LAB_EXP_THREADS  // exp_kernel.cuh may define each knob's threads per block (a warp-specialised knob's)
#define RA_LAB_EXP_THREADS(knob, D) 256
#endif
#ifndef RA_LAB_EXP_PERSISTENT  // exp_kernel.cuh may name the knobs launched persistent (of a run-time knob)
#define RA_LAB_EXP_PERSISTENT(knob) false
#endif
#ifndef RA_LAB_KNOBS
#define RA_LAB_KNOBS RA_LAB_KNOB(0)
#endif

using namespace ra;
using T16 = __nv_bfloat16;

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return uint32_t(x);
}
__global__ void fill_bf16(T16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    // about N(0, 1): sum of 4 uniforms, centred and scaled
    float s = 0;
    for (int j = 0; j < 4; ++j) s += (hash32(seed * 0x9E3779B97F4A7C15ULL + i * 4 + j) >> 8) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16((s - 2.0f) * 1.7320508f);
  }
}
__global__ void fill_stats(float* lse, float* delta, int H, int Tn, bool causal, float base) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H * Tn; i += gridDim.x * blockDim.x) {
    const int t = i % Tn;
    lse[i] = logf(causal ? float(t + 1) : float(Tn)) + base;
    delta[i] = ((hash32(i + 77) >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.1f;
  }
}
__global__ void fill_pos(int64_t* p, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = i;
}

// cluster > 1: launched as clusters of that many consecutive key blocks (RA_LAB_CLUSTER, the experimental kernel only).
template <typename Traits>
void launch(const void* kernel, const FlashBackwardArgs& g, cudaStream_t s, unsigned cluster = 1,
            unsigned threads = 256, bool persistent = false) {
  RA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Traits::kSmemBytes)));
  dim3 grid(unsigned((g.a.kv_len + Traits::kBlockN - 1) / Traits::kBlockN), unsigned(g.a.kv_heads),
            unsigned(g.a.batch));
  if (persistent) {
    int sms = 0;
    RA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    grid = dim3(std::min(grid.x * grid.y * grid.z, unsigned(sms)));
  }
  void* args[] = {const_cast<FlashBackwardArgs*>(&g)};
  if (cluster <= 1) {
    RA_CUDA_CHECK(cudaLaunchKernel(kernel, grid, dim3(threads), args, Traits::kSmemBytes, s));
    return;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid, config.blockDim = dim3(threads), config.dynamicSmemBytes = Traits::kSmemBytes, config.stream = s;
  config.attrs = attr, config.numAttrs = 1;
  RA_CUDA_CHECK(cudaLaunchKernelExC(&config, kernel, args));
}

template <int D>
int run(int H, int Tn, bool causal, int iters, std::vector<int> knobs) {
  const char* batch_env = std::getenv("RA_LAB_BATCH");
  const int B = batch_env ? std::max(1, std::atoi(batch_env)) : 1;
  const size_t n = size_t(B) * Tn * H * D;
  T16 *q, *k, *v, *d_o, *dk, *dv;
  float *lse, *delta, *dq;
  int64_t* pos;
  for (T16** p : {&q, &k, &v, &d_o, &dk, &dv}) RA_CUDA_CHECK(cudaMalloc(p, n * 2));
  RA_CUDA_CHECK(cudaMalloc(&lse, size_t(B) * H * Tn * 4));
  RA_CUDA_CHECK(cudaMalloc(&delta, size_t(B) * H * Tn * 4));
  RA_CUDA_CHECK(cudaMalloc(&dq, n * 4));
  RA_CUDA_CHECK(cudaMalloc(&pos, size_t(Tn) * 8));
  int seed = 1;
  for (T16* p : {q, k, v, d_o}) fill_bf16<<<1024, 256>>>(p, n, seed++);
  fill_stats<<<1024, 256>>>(lse, delta, B * H, Tn, causal, 0.5f);
  fill_pos<<<256, 256>>>(pos, Tn);
  RA_CUDA_CHECK(cudaDeviceSynchronize());

  FlashBackwardArgs g{};
  CudaAttentionArgs& a = g.a;
  auto view = [&](const void* p) { return DeviceView4{p, {int64_t(Tn) * H * D, int64_t(H) * D, D, 1}}; };
  a.q = view(q), a.k = view(k), a.v = view(v);
  a.pos.q = pos, a.pos.k = pos, a.pos.total_keys = Tn, a.pos.keys_sorted = true, a.pos.queries_sorted = true;
  a.batch = B, a.q_len = Tn, a.kv_len = Tn, a.q_heads = H, a.kv_heads = H, a.head_dim = D, a.value_dim = D;
  a.scale = 1.0f / std::sqrt(float(D));
  a.causal = causal;
  g.d_o = view(d_o);
  g.lse = lse, g.delta = delta, g.dq = dq, g.dk_direct = dk, g.dv_direct = dv;
  g = exp_backward::with_step_maps<T16, exp_backward::WgmmaBackwardTraits<T16, D>>(g);  // both kernels' TMA maps
#ifdef RA_LAB_EXP_SETUP  // exp_kernel.cuh's own set-up (e.g. maps of its own in constant memory)
  RA_LAB_EXP_SETUP(g, T16, D);
#endif

  using Base = wgmma_backward::WgmmaBackwardTraits<T16, D>;
  using Exp = exp_backward::WgmmaBackwardTraits<T16, D>;
  const bool apart = std::getenv("RA_LAB_DQ_APART") && std::atoi(std::getenv("RA_LAB_DQ_APART")) != 0;
  if (apart && D != 192 && D != 256) {
    std::printf("RA_LAB_DQ_APART: D = 192 or 256 (the library's dQ-apart head dims)\n");
    std::exit(2);
  }
  const void* base = apart ? reinterpret_cast<const void*>(
                                 wgmma_backward::flash_wgmma_backward_kernel<T16, D, false, false, false, false, false, true>)
                           : reinterpret_cast<const void*>(wgmma_backward::flash_wgmma_backward_kernel<T16, D, false, false, false, false>);
  auto exp_of = [apart](int knob) -> const void* {
    switch (knob) {
#define RA_LAB_KNOB(K)                                                                                        \
  case K:                                                                                                     \
    return apart ? reinterpret_cast<const void*>(exp_backward::exp_backward_kernel<T16, D, false, false, false, false, false, true, false, false, false, K>) \
                 : reinterpret_cast<const void*>(exp_backward::exp_backward_kernel<T16, D, false, false, false, false, false, false, false, false, false, K>);
      RA_LAB_KNOBS
#undef RA_LAB_KNOB
    }
    std::printf("knob %d not built\n", knob);
    std::exit(2);
  };
  auto exp_threads = [](int knob) -> unsigned {
    switch (knob) {
#define RA_LAB_KNOB(K) \
  case K:              \
    return RA_LAB_EXP_THREADS(K, D);
      RA_LAB_KNOBS
#undef RA_LAB_KNOB
    }
    return 256;
  };
  cudaStream_t s;
  RA_CUDA_CHECK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  RA_CUDA_CHECK(cudaEventCreate(&e0));
  RA_CUDA_CHECK(cudaEventCreate(&e1));
  const double flops = 2.5 * 4.0 * B * H * double(Tn) * Tn * D / (causal ? 2 : 1);
  const char* cluster_env = std::getenv("RA_LAB_CLUSTER");
  const unsigned cluster = cluster_env ? unsigned(std::atoi(cluster_env)) : 1u;

  // Reference gradients from the committed kernel.
  std::vector<float> ref_dq(n);
  std::vector<T16> ref_dk(n), ref_dv(n);
  auto once = [&](bool use_exp, int knob) {
    RA_CUDA_CHECK(cudaMemsetAsync(dq, 0, n * 4, s));
    g.dq_writer_words = knob;
    if (use_exp)
      launch<Exp>(exp_of(knob), g, s, cluster, exp_threads(knob), RA_LAB_EXP_PERSISTENT(knob));
    else
      launch<Base>(base, g, s);
    if (apart) launch_flash_wgmma_dq<T16>(g, s);
  };
  once(false, 0);
  RA_CUDA_CHECK(cudaStreamSynchronize(s));
  RA_CUDA_CHECK(cudaMemcpy(ref_dq.data(), dq, n * 4, cudaMemcpyDeviceToHost));
  RA_CUDA_CHECK(cudaMemcpy(ref_dk.data(), dk, n * 2, cudaMemcpyDeviceToHost));
  RA_CUDA_CHECK(cudaMemcpy(ref_dv.data(), dv, n * 2, cudaMemcpyDeviceToHost));
  double ref_scale = 0;
  for (size_t i = 0; i < n; i += 97) ref_scale = std::max(ref_scale, double(std::fabs(ref_dq[i])));

  auto time_it = [&](bool use_exp, int knob) {
    std::vector<float> ms;
    for (int it = 0; it < iters + 2; ++it) {
      RA_CUDA_CHECK(cudaMemsetAsync(dq, 0, n * 4, s));
      g.dq_writer_words = knob;
      RA_CUDA_CHECK(cudaEventRecord(e0, s));
      if (use_exp)
        launch<Exp>(exp_of(knob), g, s, cluster, exp_threads(knob), RA_LAB_EXP_PERSISTENT(knob));
      else
        launch<Base>(base, g, s);
      if (apart) launch_flash_wgmma_dq<T16>(g, s);
      RA_CUDA_CHECK(cudaEventRecord(e1, s));
      RA_CUDA_CHECK(cudaEventSynchronize(e1));
      float t;
      RA_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (it >= 2) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };
  auto check = [&](int knob) {
    once(true, knob);
    RA_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> got_dq(n);
    std::vector<T16> got_dk(n), got_dv(n);
    RA_CUDA_CHECK(cudaMemcpy(got_dq.data(), dq, n * 4, cudaMemcpyDeviceToHost));
    RA_CUDA_CHECK(cudaMemcpy(got_dk.data(), dk, n * 2, cudaMemcpyDeviceToHost));
    RA_CUDA_CHECK(cudaMemcpy(got_dv.data(), dv, n * 2, cudaMemcpyDeviceToHost));
    double edq = 0, edk = 0, edv = 0, sdk = 0, sdv = 0;
    for (size_t i = 0; i < n; ++i) {
      edq = std::max(edq, double(std::fabs(got_dq[i] - ref_dq[i])));
      edk = std::max(edk, double(std::fabs(__bfloat162float(got_dk[i]) - __bfloat162float(ref_dk[i]))));
      edv = std::max(edv, double(std::fabs(__bfloat162float(got_dv[i]) - __bfloat162float(ref_dv[i]))));
      sdk = std::max(sdk, double(std::fabs(__bfloat162float(ref_dk[i]))));
      sdv = std::max(sdv, double(std::fabs(__bfloat162float(ref_dv[i]))));
    }
    std::printf("  check knob %d: max|ddq| %.3g (of %.3g)  max|ddk| %.3g (of %.3g)  max|ddv| %.3g (of %.3g)\n", knob, edq,
                ref_scale, edk, sdk, edv, sdv);
  };
  for (int knob : knobs) check(knob);
  for (int round = 0; round < 2; ++round) {
    const double tb = time_it(false, 0);
    std::printf("B=%d D=%d H=%d T=%d causal=%d base      %8.3f ms %7.1f TFLOP/s\n", B, D, H, Tn, int(causal), tb, flops / tb / 1e9);
    for (int knob : knobs) {
      const double te = time_it(true, knob);
      std::printf("B=%d D=%d H=%d T=%d causal=%d exp knob %-3d %8.3f ms %7.1f TFLOP/s  %.3f of base\n", B, D, H, Tn, int(causal), knob,
                  te, flops / te / 1e9, tb / te);
    }
  }
  for (void* p : {(void*)q, (void*)k, (void*)v, (void*)d_o, (void*)dk, (void*)dv, (void*)lse, (void*)delta, (void*)dq, (void*)pos})
    RA_CUDA_CHECK(cudaFree(p));
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 6) {
    std::printf("usage: wgmma_backward_lab D H T causal iters knob...\n");
    return 2;
  }
  const int D = std::atoi(argv[1]), H = std::atoi(argv[2]), Tn = std::atoi(argv[3]);
  const bool causal = std::atoi(argv[4]) != 0;
  const int iters = std::atoi(argv[5]);
  std::vector<int> knobs;
  for (int i = 6; i < argc; ++i) knobs.push_back(std::atoi(argv[i]));
  if (knobs.empty()) knobs.push_back(0);
  switch (D) {
#ifdef RA_LAB_D128
    case 128: return run<128>(H, Tn, causal, iters, knobs);
    case 64: return run<64>(H, Tn, causal, iters, knobs);
#endif
    case 192: return run<192>(H, Tn, causal, iters, knobs);
    case 256: return run<256>(H, Tn, causal, iters, knobs);
  }
  std::printf("D %d not built\n", D);
  return 2;
}
