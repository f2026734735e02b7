// Training through ring attention on GPUs: one GPU per rank with NCCL bootstrapped over MPI (ranks that
// share a GPU run the ring over MPI and copy engines instead: NCCL refuses a shared GPU). Every rank
// keeps f32 master copies of its contiguous shard of Q, K and V (the parameters here) and feeds bf16
// copies on the device to the ring's forward (flash_attn2 steps), takes the loss 0.5 * |O - target|^2
// (dO = O - target) and the ring's backward, checks the first step's dQ, dK, dV against the f64
// reference gradients of the whole sequence, then takes gradient steps and prints the loss going down.
// Exits 77 (skipped) without a GPU. Run: mpirun -np 2 ./train_ring_cuda
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <ringattn/ringattn.h>
#include <vector>

namespace {

// A bf16 copy of `values` (host f32) on the device, shaped `shape`.
ra::Tensor to_device_bf16(const std::vector<float>& values, const ra::Shape& shape) {
  ra::Tensor host(ra::DType::kBF16, shape);
  ra::convert_from_f32(values.data(), host.data<char>(), ra::DType::kBF16, values.size());
  return ra::to_memory(host, ra::MemoryKind::kCuda);
}

std::vector<float> to_host_f32(const ra::Tensor& t) {
  const ra::Tensor host = ra::to_memory(t, ra::MemoryKind::kHost);
  std::vector<float> out(size_t(host.numel()));
  ra::convert_to_f32(host.data<char>(), host.dtype(), out.data(), out.size());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  ra::MpiSession mpi(&argc, &argv);  // MPI for the job's lifetime; its local rank picks the GPU
  int code = 0;
  try {
    ra::MpiCommunicator world(MPI_COMM_WORLD);
    if (ra::cuda_device_count() == 0) {
      if (world.rank() == 0) std::printf("train_ring_cuda: no CUDA device, skipped\n");
      code = 77;
    } else {
      ra::cuda_select_device(mpi.local_rank());
      const bool sharing = ra::ranks_share_devices(world, mpi.local_rank(), ra::cuda_device_count());
      std::unique_ptr<ra::NcclCommunicator> nccl;
      if (!sharing) nccl = std::make_unique<ra::NcclCommunicator>(world);
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

      const int64_t B = 1, T = 512, H = 4, D = 64;
      const int n = world.size(), rank = world.rank();
      const int64_t local = T / n, row = H * D;  // T divisible by the ranks here, for brevity
      std::mt19937_64 rng(11);
      std::normal_distribution<float> normal;
      std::vector<float> q(B * T * row), k(q.size()), v(q.size()), target(q.size());
      for (auto* t : {&q, &k, &v, &target})
        for (float& x : *t) x = normal(rng);
      // This rank's shards: f32 master copies (updated by the steps), bf16 on the device for the ring.
      auto shard = [&](const std::vector<float>& t) {
        return std::vector<float>(t.begin() + rank * local * row, t.begin() + (rank + 1) * local * row);
      };
      std::vector<float> q_own = shard(q), k_own = shard(k), v_own = shard(v);

      ra::AttentionParams params;
      params.causal = true;
      ra::RingContext ctx{nccl ? static_cast<ra::Communicator*>(nccl.get()) : &world, ra::SequenceLayout::kContiguous,
                          T, T, "flash_attn2", std::chrono::seconds(60)};
      ctx.host_comm = &world;  // the copy engines' handshakes
      auto ring = ra::AttentionRegistry::builtin().create("ring", ra::Backend::kCuda, &ctx);
      ring->set_cuda_stream(stream);
      const ra::TokenPositions pos = ra::ring_positions(ctx);
      const ra::Shape shape{B, local, H, D};

      double first_loss = 0, last_loss = 0;
      for (int step = 0; step < 40; ++step) {
        const ra::Tensor q_dev = to_device_bf16(q_own, shape), k_dev = to_device_bf16(k_own, shape),
                         v_dev = to_device_bf16(v_own, shape);
        ra::AttentionInputs in;
        in.q = q_dev, in.k = k_dev, in.v = v_dev;
        const ra::AttentionOutput out = ring->forward(in, params, pos);
        cudaStreamSynchronize(stream);
        const std::vector<float> o = to_host_f32(out.o);
        std::vector<float> d_o(o.size());
        double loss = 0;
        for (size_t i = 0; i < o.size(); ++i) {
          d_o[i] = o[i] - target[size_t(rank * local * row) + i];
          loss += 0.5 * double(d_o[i]) * d_o[i];
        }
        world.all_reduce(&loss, 1, ra::ReduceOp::kSum);
        (step == 0 ? first_loss : last_loss) = loss;
        // The ring's backward, given the forward's O and LSE; dO in the inputs' dtype, gradients in f32.
        const ra::Tensor d_o_dev = to_device_bf16(d_o, shape);
        const ra::Gradients g = ring->backward(in, params, pos, d_o_dev, &out, /*f32_gradients=*/true);
        cudaStreamSynchronize(stream);
        const std::vector<float> dq = to_host_f32(g.dq), dk = to_host_f32(g.dk), dv = to_host_f32(g.dv);

        if (step == 0) {  // against f64 on the same bf16 values: this rank's queries see every key
          const ra::Tensor q_all = ra::to_memory(q_dev, ra::MemoryKind::kHost), d_o_host = ra::to_memory(d_o_dev, ra::MemoryKind::kHost);
          ra::Tensor k_all(ra::DType::kBF16, {B, T, H, D}), v_all(ra::DType::kBF16, {B, T, H, D});
          world.all_gather(ra::to_memory(k_dev, ra::MemoryKind::kHost).data<char>(), k_all.data<char>(), k_dev.view().nbytes());
          world.all_gather(ra::to_memory(v_dev, ra::MemoryKind::kHost).data<char>(), v_all.data<char>(), v_dev.view().nbytes());
          ra::AttentionInputs all;
          all.q = q_all, all.k = k_all, all.v = v_all;
          ra::TokenPositions ref_pos = ra::TokenPositions::dense(T, T);
          ref_pos.q = pos.q;
          ra::ReferenceGradients ref = ra::reference_attention_backward_f64(all, params, ref_pos, d_o_host);
          world.all_reduce(ref.dk.data(), ref.dk.size(), ra::ReduceOp::kSum);
          world.all_reduce(ref.dv.data(), ref.dv.size(), ra::ReduceOp::kSum);
          double worst = 0, largest = 0;
          for (int64_t i = 0; i < local * row; ++i) {
            const size_t global = size_t(rank * local * row + i);
            worst = std::max({worst, std::abs(dq[size_t(i)] - ref.dq[size_t(i)]), std::abs(dk[size_t(i)] - ref.dk[global]),
                              std::abs(dv[size_t(i)] - ref.dv[global])});
            largest = std::max({largest, std::abs(ref.dq[size_t(i)]), std::abs(ref.dk[global]), std::abs(ref.dv[global])});
          }
          world.all_reduce(&worst, 1, ra::ReduceOp::kMax);
          world.all_reduce(&largest, 1, ra::ReduceOp::kMax);
          code |= worst > 0.02 * largest;  // P and dS rounded to bf16 for the tensor cores
          if (rank == 0)
            std::printf("train_ring_cuda: %d ranks (%s), T=%ld bf16 causal: max |dQ, dK, dV - f64 reference| = %.3g "
                        "(largest %.3g)\n", n, nccl ? "NCCL or copy engines" : "sharing a GPU, copy engines", long(T),
                        worst, largest);
        }
        const float lr = 0.2f;  // a gradient step on the f32 master copies (0.5 diverges at this size)
        for (auto [param, grad] : {std::pair{&q_own, &dq}, std::pair{&k_own, &dk}, std::pair{&v_own, &dv}})
          for (size_t i = 0; i < param->size(); ++i) (*param)[i] -= lr * (*grad)[i];
      }
      code |= !(last_loss < 0.9 * first_loss);
      if (rank == 0)
        std::printf("train_ring_cuda: loss %.4f -> %.4f after 40 steps -> %s\n", first_loss, last_loss,
                    code ? "FAILED" : "OK");
      cudaStreamDestroy(stream);
    }
  } catch (const ra::Error& e) {
    std::fprintf(stderr, "train_ring_cuda: %s\n", e.what());
    code = 3;
  }
  return code;
}
