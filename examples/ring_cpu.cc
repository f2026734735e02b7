// Ring attention embedded in a program that owns MPI: every rank builds the same random problem,
// keeps its contiguous shard of the sequence in its own buffers, runs `ring` over MPI_COMM_WORLD and
// checks its rows against the f64 reference. Run: mpirun -np 2 ./ring_cpu
#include <mpi.h>

#include <cstdio>
#include <random>
#include <ringattn/ringattn.h>
#include <vector>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);  // the program owns MPI
  int failed = 0;
  {
    ra::MpiCommunicator world(MPI_COMM_WORLD);  // a duplicate: our traffic stays apart from the caller's
    const int64_t B = 1, T = 256, H = 4, D = 64;
    const int n = world.size(), rank = world.rank();
    const int64_t local = T / n;

    // The caller's own memory, wrapped without copies.
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> q(B * T * H * D), k(q.size()), v(q.size());
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = normal(rng);
    auto shard = [&](std::vector<float>& t) {
      return ra::TensorView(t.data() + rank * local * H * D, ra::DType::kF32, {B, local, H, D});
    };
    ra::AttentionInputs in;
    in.q = shard(q);
    in.k = shard(k);
    in.v = shard(v);

    ra::AttentionParams params;
    params.causal = true;
    ra::RingContext ctx;
    ctx.comm = &world;
    ctx.layout = ra::SequenceLayout::kContiguous;
    ctx.global_q_len = T;
    ctx.global_kv_len = T;
    ctx.local_impl = "flash_attn2";

    ra::AttentionRegistry registry;  // a registry the program owns
    ra::register_builtin_implementations(registry);
    auto ring = registry.create("ring", ra::Backend::kCpu, &ctx);
    const ra::TokenPositions pos = ra::ring_positions(ctx);
    ra::AttentionOutput out = ring->forward(in, params, pos);

    // This rank's rows against all keys, in f64.
    ra::AttentionInputs all = in;
    all.k = ra::TensorView(k.data(), ra::DType::kF32, {B, T, H, D});
    all.v = ra::TensorView(v.data(), ra::DType::kF32, {B, T, H, D});
    ra::TokenPositions ref_pos = ra::TokenPositions::dense(T, T);
    ref_pos.q = pos.q;
    const ra::ReferenceOutput ref = ra::reference_attention_f64(all, params, ref_pos);
    double worst = 0;
    for (int64_t i = 0; i < out.o.numel(); ++i) worst = std::max(worst, std::abs(out.o.data<float>()[i] - ref.o[size_t(i)]));
    failed = worst > ra::output_tolerance(ra::DType::kF32, 5.0) ? 1 : 0;
    world.all_reduce(&worst, 1, ra::ReduceOp::kMax);
    int64_t any = failed;
    world.all_reduce(&any, 1, ra::ReduceOp::kMax);
    failed = int(any);
    if (rank == 0)
      std::printf("ring_cpu: %d ranks, T=%ld, causal: max |O - f64 reference| = %.3g -> %s\n", n, long(T), worst,
                  failed ? "FAILED" : "OK");
  }
  MPI_Finalize();
  return failed;
}
