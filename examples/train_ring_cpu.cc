// Training through ring attention over MPI: every rank holds its contiguous shard of Q, K and V (the
// parameters here), runs the ring's forward, takes the loss 0.5 * |O - target|^2 (so dO = O - target)
// and the ring's backward, checks the first step's dQ, dK, dV against the f64 reference gradients of
// the whole sequence, then takes plain gradient steps and prints the loss going down.
// Run: mpirun -np 2 ./train_ring_cpu
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <ringattn/ringattn.h>
#include <vector>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int failed = 0;
  {
    ra::MpiCommunicator world(MPI_COMM_WORLD);
    const int64_t B = 1, T = 128, H = 4, D = 32;
    const int n = world.size(), rank = world.rank();
    const int64_t local = T / n, row = H * D;  // T divisible by the ranks here, for brevity

    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal;
    std::vector<float> q(B * T * row), k(q.size()), v(q.size()), target(q.size());
    for (auto* t : {&q, &k, &v, &target})
      for (float& x : *t) x = normal(rng);
    auto shard = [&](std::vector<float>& t) {
      return ra::TensorView(t.data() + rank * local * row, ra::DType::kF32, {B, local, H, D});
    };
    ra::AttentionInputs in;
    in.q = shard(q), in.k = shard(k), in.v = shard(v);

    ra::AttentionParams params;
    params.causal = true;
    ra::RingContext ctx;
    ctx.comm = &world;
    ctx.layout = ra::SequenceLayout::kContiguous;
    ctx.global_q_len = T;
    ctx.global_kv_len = T;
    ctx.local_impl = "flash_attn2";
    ra::AttentionRegistry registry;
    ra::register_builtin_implementations(registry);
    auto ring = registry.create("ring", ra::Backend::kCpu, &ctx);
    const ra::TokenPositions pos = ra::ring_positions(ctx);

    double first_loss = 0, last_loss = 0;
    for (int step = 0; step < 30; ++step) {
      const ra::AttentionOutput out = ring->forward(in, params, pos);
      // dO = O - target on this rank's rows; the loss summed over the ranks.
      ra::Tensor d_o(ra::DType::kF32, {B, local, H, D});
      double loss = 0;
      for (int64_t i = 0; i < d_o.numel(); ++i) {
        d_o.data<float>()[i] = out.o.data<float>()[i] - target[size_t(rank * local * row + i)];
        loss += 0.5 * double(d_o.data<float>()[i]) * d_o.data<float>()[i];
      }
      world.all_reduce(&loss, 1, ra::ReduceOp::kSum);
      (step == 0 ? first_loss : last_loss) = loss;
      // The ring's backward, given the forward's O and LSE; gradients in f32.
      const ra::Gradients g = ring->backward(in, params, pos, d_o.view(), &out, /*f32_gradients=*/true);

      if (step == 0) {  // against f64: this rank's queries see every key; dK and dV sum over the ranks
        ra::AttentionInputs all = in;
        all.k = ra::TensorView(k.data(), ra::DType::kF32, {B, T, H, D});
        all.v = ra::TensorView(v.data(), ra::DType::kF32, {B, T, H, D});
        ra::TokenPositions ref_pos = ra::TokenPositions::dense(T, T);
        ref_pos.q = pos.q;
        ra::ReferenceGradients ref = ra::reference_attention_backward_f64(all, params, ref_pos, d_o.view());
        world.all_reduce(ref.dk.data(), ref.dk.size(), ra::ReduceOp::kSum);
        world.all_reduce(ref.dv.data(), ref.dv.size(), ra::ReduceOp::kSum);
        double worst = 0;
        for (int64_t i = 0; i < local * row; ++i) {
          worst = std::max(worst, std::abs(g.dq.data<float>()[i] - ref.dq[size_t(i)]));
          worst = std::max(worst, std::abs(g.dk.data<float>()[i] - ref.dk[size_t(rank * local * row + i)]));
          worst = std::max(worst, std::abs(g.dv.data<float>()[i] - ref.dv[size_t(rank * local * row + i)]));
        }
        world.all_reduce(&worst, 1, ra::ReduceOp::kMax);
        failed |= worst > 1e-4;
        if (rank == 0)
          std::printf("train_ring_cpu: %d ranks, T=%ld causal: max |dQ, dK, dV - f64 reference| = %.3g\n", n, long(T),
                      worst);
      }
      // A gradient step on this rank's shard of Q, K and V.
      const float lr = 0.5f;
      for (auto [param, grad] : {std::pair{in.q, &g.dq}, std::pair{in.k, &g.dk}, std::pair{in.v, &g.dv}})
        for (int64_t i = 0; i < local * row; ++i) param.data_as<float>()[i] -= lr * grad->data<float>()[i];
    }
    failed |= !(last_loss < 0.9 * first_loss);
    if (rank == 0)
      std::printf("train_ring_cpu: loss %.4f -> %.4f after 30 steps -> %s\n", first_loss, last_loss,
                  failed ? "FAILED" : "OK");
  }
  MPI_Finalize();
  return failed;
}
