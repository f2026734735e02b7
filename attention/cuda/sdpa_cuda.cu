// sdpa on the device. Per (batch, head) and per chunk of query rows (the scores of one chunk stay
// under 1 GiB): scores = Q K^T (cuBLAS), softmax-and-fold into the carry, numerator += P V (cuBLAS).
#include "attention/cuda/sdpa_cuda.h"

#include <cublas_v2.h>

#include <algorithm>

#include "attention/cuda/device_math.cuh"
#include "attention/cuda/pair_logit.cuh"
#include "attention/online_softmax.h"
#include "runtime/cuda_device.h"
#include "runtime/memory.h"

#define RA_CUBLAS_CHECK(call)                                                         \
  do {                                                                                \
    cublasStatus_t ra_status_ = (call);                                               \
    if (ra_status_ != CUBLAS_STATUS_SUCCESS)                                          \
      RA_FAIL(#call, " failed: ", cublasGetStatusName(ra_status_), " (", cublasGetStatusString(ra_status_), ")"); \
  } while (0)

namespace ra {
namespace {

constexpr int kSoftmaxThreads = 256;

// (B, L, H, D) strided, any float dtype -> contiguous f32.
__global__ void to_f32_kernel(const void* src, DType dtype, DeviceView4 view, int64_t L, int64_t H, int64_t D,
                              float* dst, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t d = i % D, h = (i / D) % H, l = (i / (D * H)) % L, b = i / (D * H * L);
  dst[i] = load_as_f32(src, b * view.stride[0] + l * view.stride[1] + h * view.stride[2] + d * view.stride[3], dtype);
}

__device__ float block_reduce(float x, bool is_max) {
  __shared__ float partial[kSoftmaxThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  __syncthreads();  // `partial` may still be read from the previous reduction
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = x;
  __syncthreads();
  x = partial[0];
  for (int w = 1; w < kSoftmaxThreads / 32; ++w) x = is_max ? fmaxf(x, partial[w]) : x + partial[w];
  return x;
}

// One block per query row t0 + blockIdx.x of (b, h): scores row (S values of q.k) -> P in place, and
// the carry row rescaled to the new running max with the row's denominator added.
__global__ void softmax_fold_kernel(const CudaAttentionArgs a, int b, int h, int t0, float* scores) {
  const int t = t0 + blockIdx.x;
  float* row = scores + int64_t(blockIdx.x) * a.kv_len;
  const int64_t qpos = a.pos.q[t];
  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < a.kv_len; j += blockDim.x) {
    const float s = pair_logit_cuda(a, row[j], b, h, t, j, qpos, a.pos.k[j]);
    row[j] = s;
    local_max = fmaxf(local_max, s);
  }
  const float row_max = block_reduce(local_max, true);
  const int64_t r = (int64_t(b) * a.q_heads + h) * a.q_len + t;
  const float m_old = a.max[r];
  const float m_new = fmaxf(m_old, row_max);
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float keep_scale = 1.0f / (1.0f - a.dropout_prob);
  float local_sum = 0.0f;
  for (int j = threadIdx.x; j < a.kv_len; j += blockDim.x) {
    float p = expf(row[j] - m_use);  // exp(-inf) = 0 for masked keys
    local_sum += p;
    if (p > 0.0f) p *= dropout_weight(a, b, h, qpos, a.pos.k[j], keep_scale);
    row[j] = p;
  }
  const float row_sum = block_reduce(local_sum, false);
  const float alpha = rescale_factor(m_old, m_use);
  for (int d = threadIdx.x; d < a.value_dim; d += blockDim.x) a.numerator[r * a.value_dim + d] *= alpha;
  if (threadIdx.x == 0) {
    a.denominator[r] = a.denominator[r] * alpha + row_sum;
    a.max[r] = m_new;
  }
}

// The backward's per-row operands: LSE, delta and where dBias goes (broadcast strides over
// (B, Hq, T, S_total); data null without a bias).
struct GradientRowArgs {
  const float* lse;
  const float* delta;
  float* dbias;
  int64_t dbias_stride[4];
};

// One block per query row t0 + blockIdx.x of (b, h): scores (q.k) and dp (dO.v) rows in, then
// scores <- dS times the soft cap's derivative and the scale (what dQ and dK need) and dp <- P after
// dropout (what dV needs); dBias gets dS.
__global__ void gradient_rows_kernel(const CudaAttentionArgs a, const GradientRowArgs g, int b, int h, int t0,
                                     float* scores, float* dp) {
  const int t = t0 + blockIdx.x;
  float* s_row = scores + int64_t(blockIdx.x) * a.kv_len;
  float* dp_row = dp + int64_t(blockIdx.x) * a.kv_len;
  const int64_t qpos = a.pos.q[t], r = (int64_t(b) * a.q_heads + h) * a.q_len + t;
  const float lse = g.lse[r], delta = g.delta[r];
  const float keep_scale = 1.0f / (1.0f - a.dropout_prob);
  for (int j = threadIdx.x; j < a.kv_len; j += blockDim.x) {
    const int64_t kpos = a.pos.k[j];
    const float s = pair_logit_cuda(a, s_row[j], b, h, t, j, qpos, kpos);
    if (s == -INFINITY || lse == -INFINITY) {
      s_row[j] = dp_row[j] = 0.0f;
      continue;
    }
    const float p = expf(s - lse);
    const float weight = dropout_weight(a, b, h, qpos, kpos, keep_scale);
    const float ds = p * (dp_row[j] * weight - delta);
    const int64_t bias_at = b * a.bias.stride[0] + h * a.bias.stride[1] + int64_t(t) * a.bias.stride[2] + kpos * a.bias.stride[3];
    if (g.dbias)
      atomicAdd(g.dbias + b * g.dbias_stride[0] + h * g.dbias_stride[1] + int64_t(t) * g.dbias_stride[2] +
                    kpos * g.dbias_stride[3], ds);
    float dx = ds * a.scale;
    if (a.soft_cap > 0.0f) {  // d(cap tanh(x / cap)) / dx = 1 - tanh^2
      const float capped = (s - (a.bias.data ? static_cast<const float*>(a.bias.data)[bias_at] : 0.0f)) / a.soft_cap;
      dx *= 1.0f - capped * capped;
    }
    s_row[j] = dx;
    dp_row[j] = p * weight;
  }
}

}  // namespace

struct SdpaCudaRunner::State {
  cublasHandle_t handle = nullptr;
};

SdpaCudaRunner::SdpaCudaRunner() : state_(std::make_unique<State>()) {
  RA_CUBLAS_CHECK(cublasCreate(&state_->handle));
  RA_CUBLAS_CHECK(cublasSetMathMode(state_->handle, CUBLAS_PEDANTIC_MATH));  // full f32, no TF32
}

SdpaCudaRunner::~SdpaCudaRunner() { (void)cublasDestroy(state_->handle); }

void SdpaCudaRunner::accumulate(const AttentionInputs& in, const CudaAttentionArgs& a, cudaStream_t stream) const {
  if (a.q_len == 0 || a.kv_len == 0) return;
  const int64_t B = a.batch, T = a.q_len, S = a.kv_len, Hq = a.q_heads, Hkv = a.kv_heads, D = a.head_dim,
                Dv = a.value_dim;
  auto as_f32 = [&](const TensorView& t, const DeviceView4& view, int64_t L, int64_t H, int64_t width) {
    Tensor out = Tensor::temporary(DType::kF32, {B, L, H, width}, MemoryKind::kCuda, stream);
    const int64_t n = out.numel();
    if (n > 0)
      to_f32_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(view.data, t.dtype(), view, L, H, width, out.data<float>(), n);
    RA_CUDA_CHECK(cudaGetLastError());
    return out;
  };
  const Tensor q = as_f32(in.q, a.q, T, Hq, D), k = as_f32(in.k, a.k, S, Hkv, D), v = as_f32(in.v, a.v, S, Hkv, Dv);
  const int64_t chunk_rows = std::max<int64_t>(1, std::min<int64_t>(T, (int64_t(1) << 28) / S));
  const Tensor scores = Tensor::temporary(DType::kF32, {chunk_rows, S}, MemoryKind::kCuda, stream);
  cublasHandle_t handle = state_->handle;
  RA_CUBLAS_CHECK(cublasSetStream(handle, stream));
  const float one = 1.0f, zero = 0.0f;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / (Hq / Hkv);
      const float* k_bh = k.data<float>() + (b * S * Hkv + kh) * D;
      const float* v_bh = v.data<float>() + (b * S * Hkv + kh) * Dv;
      for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
        const int64_t rows = std::min(chunk_rows, T - t0);
        const float* q_rows = q.data<float>() + ((b * T + t0) * Hq + h) * D;
        // Column-major view: scores^T (S x rows) = K (S x D) . Q^T (D x rows).
        RA_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(S), int(rows), int(D), &one, k_bh, int(Hkv * D),
                                    q_rows, int(Hq * D), &zero, scores.data<float>(), int(S)));
        softmax_fold_kernel<<<unsigned(rows), kSoftmaxThreads, 0, stream>>>(a, int(b), int(h), int(t0), scores.data<float>());
        RA_CUDA_CHECK(cudaGetLastError());
        // numerator^T (Dv x rows) += V^T (Dv x S) . P^T (S x rows).
        float* num_rows = a.numerator + ((b * Hq + h) * T + t0) * Dv;
        RA_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(Dv), int(rows), int(S), &one, v_bh, int(Hkv * Dv),
                                    scores.data<float>(), int(S), &one, num_rows, int(Dv)));
      }
    }
  // The temporaries go back to the cache on return, in the stream's order, after the work that reads them.
}

void SdpaCudaRunner::accumulate_backward(const AttentionInputs& in, const CudaAttentionArgs& a,
                                         const BackwardInputs& grad, const GradViews& acc, cudaStream_t stream) const {
  if (a.q_len == 0 || a.kv_len == 0) return;
  const int64_t B = a.batch, T = a.q_len, S = a.kv_len, Hq = a.q_heads, Hkv = a.kv_heads, D = a.head_dim,
                Dv = a.value_dim;
  auto as_f32 = [&](const TensorView& t, int64_t L, int64_t H, int64_t width) {
    Tensor out = Tensor::temporary(DType::kF32, {B, L, H, width}, MemoryKind::kCuda, stream);
    DeviceView4 view{t.data(), {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
    const int64_t n = out.numel();
    if (n > 0)
      to_f32_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(t.data(), t.dtype(), view, L, H, width, out.data<float>(), n);
    RA_CUDA_CHECK(cudaGetLastError());
    return out;
  };
  const Tensor q = as_f32(in.q, T, Hq, D), k = as_f32(in.k, S, Hkv, D), v = as_f32(in.v, S, Hkv, Dv);
  const Tensor d_o = as_f32(grad.d_o, T, Hq, Dv);
  GradientRowArgs g{grad.lse.data_as<float>(), grad.delta.data_as<float>(), nullptr, {0, 0, 0, 0}};
  if (const TensorView dbias = dbias_over_pairs(acc.dbias, in, a.pos.total_keys); dbias.defined()) {
    g.dbias = dbias.data_as<float>();
    for (int i = 0; i < 4; ++i) g.dbias_stride[i] = dbias.stride(i);
  }
  const int64_t chunk_rows = std::max<int64_t>(1, std::min<int64_t>(T, (int64_t(1) << 27) / S));
  const Tensor scores = Tensor::temporary(DType::kF32, {chunk_rows, S}, MemoryKind::kCuda, stream),
               dp = Tensor::temporary(DType::kF32, {chunk_rows, S}, MemoryKind::kCuda, stream);
  cublasHandle_t handle = state_->handle;
  RA_CUBLAS_CHECK(cublasSetStream(handle, stream));
  const float one = 1.0f, zero = 0.0f;
  float *dq = acc.dq.data_as<float>(), *dk = acc.dk.data_as<float>(), *dv = acc.dv.data_as<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / (Hq / Hkv), k_at = (b * S * Hkv + kh) * D, v_at = (b * S * Hkv + kh) * Dv;
      for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
        const int64_t rows = std::min(chunk_rows, T - t0), q_at = ((b * T + t0) * Hq + h) * D;
        const int64_t do_at = ((b * T + t0) * Hq + h) * Dv;
        // Column-major views of row-major matrices: scores^T (S x rows) = K . Q^T, dp^T = V . dO^T.
        RA_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(S), int(rows), int(D), &one,
                                    k.data<float>() + k_at, int(Hkv * D), q.data<float>() + q_at, int(Hq * D), &zero,
                                    scores.data<float>(), int(S)));
        RA_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(S), int(rows), int(Dv), &one,
                                    v.data<float>() + v_at, int(Hkv * Dv), d_o.data<float>() + do_at, int(Hq * Dv),
                                    &zero, dp.data<float>(), int(S)));
        gradient_rows_kernel<<<unsigned(rows), kSoftmaxThreads, 0, stream>>>(a, g, int(b), int(h), int(t0),
                                                                             scores.data<float>(), dp.data<float>());
        RA_CUDA_CHECK(cudaGetLastError());
        // dV^T (Dv x S) += dO^T . PW;  dK^T (D x S) += Q^T . dS;  dQ^T (D x rows) += K^T . dS^T.
        RA_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, int(Dv), int(S), int(rows), &one,
                                    d_o.data<float>() + do_at, int(Hq * Dv), dp.data<float>(), int(S), &one, dv + v_at,
                                    int(Hkv * Dv)));
        RA_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, int(D), int(S), int(rows), &one,
                                    q.data<float>() + q_at, int(Hq * D), scores.data<float>(), int(S), &one, dk + k_at,
                                    int(Hkv * D)));
        RA_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(D), int(rows), int(S), &one,
                                    k.data<float>() + k_at, int(Hkv * D), scores.data<float>(), int(S), &one, dq + q_at,
                                    int(Hq * D)));
      }
    }
}

}  // namespace ra
