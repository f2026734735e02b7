// Ring attention on GPUs from a program that owns MPI, its device buffers and its CUDA stream: one
// GPU per rank, NCCL bootstrapped over MPI, bf16 shards in caller-owned device memory, O and LSE
// checked on the host against the f64 reference. Exits 77 (skipped) without a GPU.
// Run: mpirun -np 2 ./ring_cuda
#include <mpi.h>

#include <cstdio>
#include <random>
#include <ringattn/ringattn.h>
#include <vector>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int code = 0;
  try {
    ra::MpiCommunicator world(MPI_COMM_WORLD);
    if (ra::cuda_device_count() == 0) {
      if (world.rank() == 0) std::printf("ring_cuda: no CUDA device, skipped\n");
      code = 77;
    } else {
      int local_rank = 0;  // ranks on this node, one GPU each
      MPI_Comm node;
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
      MPI_Comm_rank(node, &local_rank);
      MPI_Comm_free(&node);
      ra::cuda_select_device(local_rank);
      ra::NcclCommunicator nccl(world);
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

      const int64_t B = 1, T = 1024, H = 8, D = 128;
      const int n = world.size(), rank = world.rank();
      const int64_t local = T / n;
      std::mt19937_64 rng(11);
      const ra::Tensor q = ra::random_normal(ra::DType::kBF16, {B, T, H, D}, rng);
      const ra::Tensor k = ra::random_normal(ra::DType::kBF16, {B, T, H, D}, rng);
      const ra::Tensor v = ra::random_normal(ra::DType::kBF16, {B, T, H, D}, rng);
      // Caller-owned device buffers holding this rank's shards.
      const size_t shard_bytes = size_t(local * H * D) * 2;
      void* dev[3];
      const ra::Tensor* host[3] = {&q, &k, &v};
      for (int i = 0; i < 3; ++i) {
        cudaMalloc(&dev[i], shard_bytes);
        cudaMemcpy(dev[i], host[i]->data<char>() + rank * shard_bytes, shard_bytes, cudaMemcpyHostToDevice);
      }
      ra::AttentionInputs in;
      in.q = ra::TensorView(dev[0], ra::DType::kBF16, {B, local, H, D}, ra::MemoryKind::kCuda);
      in.k = ra::TensorView(dev[1], ra::DType::kBF16, {B, local, H, D}, ra::MemoryKind::kCuda);
      in.v = ra::TensorView(dev[2], ra::DType::kBF16, {B, local, H, D}, ra::MemoryKind::kCuda);

      ra::AttentionParams params;
      params.causal = true;
      ra::RingContext ctx{&nccl, ra::SequenceLayout::kContiguous, T, T, "flash_attn2", std::chrono::seconds(60)};
      auto ring = ra::AttentionRegistry::builtin().create("ring", ra::Backend::kCuda, &ctx);
      ring->set_cuda_stream(stream);
      const ra::TokenPositions pos = ra::ring_positions(ctx);
      ra::AttentionOutput out = ring->forward(in, params, pos);
      cudaStreamSynchronize(stream);
      const ra::Tensor o = ra::to_memory(out.o, ra::MemoryKind::kHost);

      ra::AttentionInputs all;
      all.q = ra::narrow(q, 1, rank * local, local);
      all.k = k;
      all.v = v;
      ra::TokenPositions ref_pos = ra::TokenPositions::dense(T, T);
      ref_pos.q = pos.q;
      const ra::ReferenceOutput ref = ra::reference_attention_f64(all, params, ref_pos);
      std::vector<float> o32(size_t(o.numel()));
      ra::convert_to_f32(o.data<char>(), ra::DType::kBF16, o32.data(), o32.size());
      double worst = 0;
      for (size_t i = 0; i < o32.size(); ++i) worst = std::max(worst, std::abs(o32[i] - ref.o[i]));
      int64_t bad = worst > ra::output_tolerance(ra::DType::kBF16, 5.0);
      world.all_reduce(&bad, 1, ra::ReduceOp::kMax);
      world.all_reduce(&worst, 1, ra::ReduceOp::kMax);
      if (rank == 0)
        std::printf("ring_cuda: %d GPUs, T=%ld bf16, causal: max |O - f64 reference| = %.3g -> %s\n", n, long(T), worst,
                    bad ? "FAILED" : "OK");
      code = int(bad);
      for (void* p : dev) cudaFree(p);
      cudaStreamDestroy(stream);
    }
  } catch (const ra::Error& e) {
    std::fprintf(stderr, "ring_cuda: %s\n", e.what());
    code = 3;
  }
  MPI_Finalize();
  return code;
}
