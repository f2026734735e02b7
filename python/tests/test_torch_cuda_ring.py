"""ringattn.torch.ring_attention on CUDA tensors under mpirun with mpi4py (the GPU ring: copy engines
between ranks of one node, ranks sharing a GPU where there are fewer GPUs than ranks): each rank's shard of
o and of dq, dk, dv (and dsinks, a shared bias's dbias: each rank's share, summed over the ranks) equals the
same rows of one process's attention on the whole sequence on the same GPU, for each layout, causal or not;
a Transformers model over the ring (ringattn.hf) gives one process's logits and gradients; a CUDA graph capture of
the ring is refused by name on every rank before any exchange. Skipped
without PyTorch, without a GPU, or in a build of ringattn without CUDA."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs none; run on a machine with it)")
import ringattn  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch (run on a GPU machine)", allow_module_level=True)
if not ringattn.built_with_cuda():
    pytest.skip("this build of ringattn has no CUDA back end", allow_module_level=True)

from mpi4py import MPI  # noqa: E402

import ringattn.torch as rt  # noqa: E402

from test_torch import relative_error  # noqa: E402
from test_torch_ring import check_ring_shards_equal_one_process  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
GPU = torch.device("cuda", RANK % torch.cuda.device_count())
torch.cuda.set_device(GPU)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("causal", [False, True])
def test_shards_of_the_gpu_ring_equal_one_process(layout, causal):
    # f16 inputs: the ring folds other blocks into its f32 carry than one call does, so the roundings of P differ.
    check_ring_shards_equal_one_process({"comm": COMM}, layout, causal, shape=(2, 203, 8, 2, 64), tol=4e-3,
                                        device=GPU, dtype=torch.float16)
    # The last call (the backward, on PyTorch's autograd thread) ran the GPU ring over one node's copy engines.
    stats = ringattn.ring_stats()
    assert stats["steps"] == SIZE and (SIZE == 1 or stats["transport"] == "copy-engines"), stats


@pytest.mark.parametrize("local_impl", ["flash_attn2", "cudnn"])
def test_a_loss_reading_the_gpu_rings_lse_gets_its_gradient(local_impl):
    # cudnn's steps take no dlse: such a backward runs the ring on flash_attn2's kernels.
    check_ring_shards_equal_one_process({"comm": COMM}, "zigzag", True, shape=(2, 256, 8, 2, 64), tol=4e-3,
                                        device=GPU, dtype=torch.float16, lse_in_loss=True, local_impl=local_impl)


def test_a_torchrun_group_with_cuda_tensors_is_refused_by_name():
    class NotMpi:  # any object with ring_shift is carried by Python (ringattn.torch.DistributedComm)
        rank, size = RANK, SIZE

        def ring_shift(self, send, recv, tag):
            raise AssertionError("no exchange may start")

        def all_reduce(self, values, dtype, op):
            raise AssertionError("no exchange may start")

    q = torch.zeros(1, 8, 2, 16, device=GPU, dtype=torch.float16)
    with pytest.raises(ValueError, match="needs comm to be an mpi4py communicator"):
        ringattn.ring_attention(q, q, q, comm=NotMpi(), global_q_len=8 * SIZE, global_kv_len=8 * SIZE)


def test_a_cuda_graph_capture_of_the_gpu_ring_is_refused_by_name_before_any_exchange():
    # Each ring call exchanges K/V with its peers and waits on the host: not a graph's to replay. Every rank
    # refuses before it sends (no rank waits for another), and the ring runs after the failed capture.
    q, k, v = (torch.randn(1, 64, 4, 64, device=GPU, dtype=torch.bfloat16) for _ in range(3))
    eager = rt.ring_attention(q, k, v, comm=COMM, causal=True)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with pytest.raises(ValueError, match="ring attention cannot be captured into a CUDA graph"):
        with torch.cuda.graph(graph, stream=side):
            rt.ring_attention(q, k, v, comm=COMM, causal=True)
    torch.testing.assert_close(rt.ring_attention(q, k, v, comm=COMM, causal=True), eager, rtol=0, atol=0)


def test_grad_wire_bf16_on_the_gpu_ring():
    # dK / dV in bfloat16 on the wire: within bf16's rounding of the running sums.
    check_ring_shards_equal_one_process({"comm": COMM, "grad_wire": "bf16"}, "zigzag", True, shape=(2, 203, 8, 2, 64),
                                        tol=2e-2, device=GPU, dtype=torch.float16)


def test_deterministic_gpu_ring_gives_the_same_bits_on_every_run():
    # The ring's steps in a fixed order on one stream and the local backward's dQ summed in a fixed order.
    gen = torch.Generator().manual_seed(70)
    B, T, H, Hkv, D = 1, 700 * SIZE, 8, 2, 64

    def shard(*shape):
        x = torch.randn(*shape, generator=gen).to(GPU, torch.bfloat16)
        return ringattn.shard(x, 1, "zigzag", RANK, SIZE)
    q, k, v, do = shard(B, T, H, D), shard(B, T, Hkv, D), shard(B, T, Hkv, D), shard(B, T, H, D)
    o, lse = ringattn.ring_attention(q, k, v, comm=COMM, causal=True, deterministic=True, return_lse=True)
    runs = [ringattn.ring_attention_backward(q, k, v, o, lse, do, comm=COMM, causal=True, deterministic=True)
            for _ in range(3)]
    for run in runs[1:]:
        for name, first, again in zip(("dq", "dk", "dv"), runs[0], run):
            assert torch.equal(first, again), name


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_attention_varlen_on_the_gpu_ring(layout):
    from test_torch_ring import check_ring_varlen_equals_one_process

    check_ring_varlen_equals_one_process({"comm": COMM}, layout, True, device=GPU, dtype=torch.float16, tol=4e-3,
                                         lengths=(100, 1, 0, 257, 30, 123), D=64)


@pytest.mark.parametrize("packed", [False, True])
def test_a_transformers_model_over_the_gpu_ring(packed):
    """ringattn.hf's ring on CUDA tensors (bf16 Llama, GQA): each rank's logits and the ranks' summed gradients
    against one process's "ringattn" model on the whole sequence (cudnn steps where the call is plain, flash_attn2
    with the packed documents' segment ids). Skipped without Transformers."""
    transformers = pytest.importorskip("transformers", reason="Transformers is not installed")
    import ringattn.hf

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=503, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=4096, attn_implementation=ringattn.hf.register())
    single = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(GPU)
    ring = copy.deepcopy(single)  # (models made from one config share it, and so their attn_implementation)
    ring.set_attn_implementation(ringattn.hf.register("ringattn_gpu_ring", comm=COMM))
    T = 1024
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 503, (1, T), generator=g).to(GPU)
    positions = (torch.cat([torch.arange(n) for n in (300, 1, 500, 223)]) if packed else torch.arange(T))[None].to(GPU)
    weights = torch.randn(1, T, 503, generator=g).to(GPU, torch.bfloat16)
    want = single(input_ids=ids, position_ids=positions, use_cache=False).logits
    (want * weights).sum().backward()
    mine, my_positions = ringattn.hf.shard_inputs(ids, RANK, SIZE, position_ids=positions)
    got = ring(input_ids=mine, position_ids=my_positions, use_cache=False).logits
    (got * ringattn.shard(weights, 1, "zigzag", RANK, SIZE)).sum().backward()

    err = relative_error(got, ringattn.shard(want, 1, "zigzag", RANK, SIZE))
    assert err < 2e-2, err
    for (name, p), (_, q) in zip(ring.named_parameters(), single.named_parameters()):
        summed = torch.as_tensor(COMM.allreduce(p.grad.float().cpu().numpy()))
        err = relative_error(summed, q.grad.cpu())
        assert err < 5e-2, (name, err)
