"""ringattn.torch.ring_attention on CUDA tensors under mpirun with mpi4py (the GPU ring: copy engines
between ranks of one node, ranks sharing a GPU where there are fewer GPUs than ranks): each rank's shard of
o and of dq, dk, dv (and dsinks, a shared bias's dbias summed over the ranks) equals the same rows of one
process's attention on the whole sequence on the same GPU, for each layout, causal or not. Skipped
without PyTorch, without a GPU, or in a build of ringattn without CUDA."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs none; run on a machine with it)")
import ringattn  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch (run on a GPU machine)", allow_module_level=True)
if not ringattn.built_with_cuda():
    pytest.skip("this build of ringattn has no CUDA back end", allow_module_level=True)

from mpi4py import MPI  # noqa: E402

import ringattn.torch as rt  # noqa: E402
from test_torch import close  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
GPU = torch.device("cuda", RANK % torch.cuda.device_count())
torch.cuda.set_device(GPU)


def shard(x, layout, axis=1):
    return ringattn.shard(x, axis, layout, RANK, SIZE)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("causal", [False, True])
def test_shards_of_the_gpu_ring_equal_one_process(layout, causal):
    g = torch.Generator().manual_seed(11)  # every rank draws the same global tensors
    B, T, H, Hkv, D = 2, 203, 8, 2, 64
    dtype = torch.float16
    q, k, v = (torch.randn(B, T, h, D, generator=g).to(GPU, dtype) for h in (H, Hkv, Hkv))
    do = torch.randn(B, T, H, D, generator=g).to(GPU, dtype)
    sinks = torch.randn(H, generator=g).to(GPU)
    bias = torch.randn(1, H, 1, T, generator=g).to(GPU)  # shared by every query row: its gradient sums over ranks
    whole = [x.clone().requires_grad_() for x in (q, k, v, sinks, bias)]
    o = rt.attention(*whole[:3], sinks=whole[3], bias=whole[4], causal=causal, softcap=4.0)
    o.backward(do)

    mine = [shard(x, layout).clone().requires_grad_() for x in (q, k, v)] + [x.clone().requires_grad_() for x in (sinks, bias)]
    o_ring = rt.ring_attention(*mine[:3], comm=COMM, layout=layout, sinks=mine[3], bias=mine[4], causal=causal,
                               softcap=4.0)
    o_ring.backward(shard(do, layout).contiguous())
    assert o_ring.device == GPU and mine[0].grad.device == GPU
    # f16 inputs: the ring folds other blocks into its f32 carry than one call does, so the roundings of P differ.
    tol = 4e-3
    close(o_ring.cpu(), shard(o, layout).cpu(), tol)
    for got, want in zip(mine[:3], whole[:3]):
        close(got.grad.cpu(), shard(want.grad, layout).cpu(), tol)
    close(mine[3].grad.cpu(), whole[3].grad.cpu(), tol)
    close(mine[4].grad.cpu(), whole[4].grad.cpu(), tol)


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
