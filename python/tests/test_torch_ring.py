"""ringattn.torch.ring_attention under mpirun with mpi4py (CTest python_torch_ring_N_ranks) and under
torchrun with torch.distributed's gloo group (python_torch_ring_torchrun): each rank's shard of o and
of dq, dk, dv (and dsinks / a shared bias's dbias, each rank's share summed over the ranks) equals the same rows of one
process's ringattn.torch.attention on the whole sequence, for each layout; torch.compile traces it.
Skipped where PyTorch is not installed."""

import pytest

import os  # noqa: E402
import time  # noqa: E402

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs none; run on a machine with it)")
import ringattn  # noqa: E402
import ringattn.torch as rt  # noqa: E402
from test_torch import close  # noqa: E402

if "TORCHELASTIC_RUN_ID" in os.environ:  # under torchrun: the default process group (gloo) carries the ring
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    RING = {"group": None}
    RANK, SIZE = dist.get_rank(), dist.get_world_size()
else:  # under mpirun
    from mpi4py import MPI

    RING = {"comm": MPI.COMM_WORLD}
    RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


@pytest.fixture(scope="session", autouse=True)
def process_group_closed_at_the_end():
    """Under torchrun, every rank ends the process group after the session's last test (a barrier, then
    destroy; once, where test_hf_ring.py's runs in the same session): a rank that exits while a gloo worker
    still drops its last collective's tensors aborts in the interpreter's shutdown (examples/train_ring.py
    says more)."""
    yield
    if "group" in RING and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        time.sleep(0.2)  # a gloo worker may still release the barrier's work, which needs the interpreter


def summed_over_ranks(x):
    """x added up over the ranks, as data- and context-parallel training adds a replicated parameter's gradient."""
    if "group" in RING:
        x = x.clone()
        dist.all_reduce(x)
        return x
    return torch.as_tensor(MPI.COMM_WORLD.allreduce(x.detach().cpu().numpy())).to(x.device)


def shard(x, layout, axis=1):
    return ringattn.shard(x, axis, layout, RANK, SIZE)


def check_ring_shards_equal_one_process(ring, layout, causal, shape, tol, device="cpu", dtype=torch.float32,
                                        lse_in_loss=False, local_impl="flash_attn2"):
    """The ring's shards of o and of the gradients (q, k, v, sinks, and a bias shared by every query row,
    whose gradient sums over the ranks) against one process's attention on the whole sequence; with
    lse_in_loss, of a loss that reads lse too. With cudnn steps: no soft cap, sinks or bias (cudnn has none)."""
    g = torch.Generator().manual_seed(11)  # every rank draws the same global tensors
    B, T, H, Hkv, D = shape
    q, k, v = (torch.randn(B, T, h, D, generator=g).to(device, dtype) for h in (H, Hkv, Hkv))
    do = torch.randn(B, T, H, D, generator=g).to(device, dtype)
    sinks = torch.randn(H, generator=g).to(device)
    bias = torch.randn(1, H, 1, T, generator=g).to(device)
    dlse = torch.randn(B, H, T, generator=g).to(device)
    options = dict(causal=causal, softcap=4.0, return_lse=True)
    extras = 2
    if local_impl == "cudnn":
        options["softcap"], extras = 0.0, 0
    whole = [x.clone().requires_grad_() for x in (q, k, v, sinks, bias)[:3 + extras]]
    o, lse = rt.attention(*whole[:3], **dict(zip(("sinks", "bias"), whole[3:])), **options)
    ((o * do).sum() + ((lse * dlse).sum() if lse_in_loss else 0)).backward()

    mine = [shard(x, layout).clone().requires_grad_() for x in (q, k, v)]
    mine += [x.detach().clone().requires_grad_() for x in whole[3:]]
    o_ring, lse_ring = rt.ring_attention(*mine[:3], **ring, layout=layout, local_impl=local_impl,
                                         **dict(zip(("sinks", "bias"), mine[3:])), **options)
    loss = (o_ring * shard(do, layout)).sum()
    if lse_in_loss:
        loss = loss + (lse_ring * shard(dlse, layout, axis=2)).sum()
    loss.backward()
    assert o_ring.device == q.device and mine[0].grad.device == q.device
    close(o_ring.cpu(), shard(o, layout).cpu(), tol)
    for got, want in zip(mine[:3], whole[:3]):
        close(got.grad.cpu(), shard(want.grad, layout).cpu(), tol)
    for got, want in zip(mine[3:], whole[3:]):  # replicated: each rank's share of the gradient
        close(summed_over_ranks(got.grad).cpu(), want.grad.cpu(), tol)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("causal", [False, True])
def test_shards_of_the_ring_equal_one_process(layout, causal):
    check_ring_shards_equal_one_process(RING, layout, causal, shape=(2, 53, 4, 2, 16), tol=1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_a_loss_reading_the_rings_lse_gets_its_gradient(layout):
    check_ring_shards_equal_one_process(RING, layout, True, shape=(2, 53, 4, 2, 16), tol=1e-5, lse_in_loss=True)


@pytest.mark.parametrize("modes, tol", [({"deterministic": True}, 1e-5), ({"grad_wire": "bf16"}, 2e-2)])
def test_ring_modes_through_autograd(modes, tol):
    """deterministic=True (exact sums) and grad_wire="bf16" (dK/dV rounded in flight) reach the ring's
    forward and backward through the ops, and agree with one process (bf16's rounding for the wire)."""
    check_ring_shards_equal_one_process({**RING, **modes}, "zigzag", True, shape=(2, 37, 4, 2, 16), tol=tol)


def test_dropout_on_a_slice_of_batch_and_heads_through_the_ring():
    """batch_offset / head_offset reach the ring's forward and backward: a rank's slice of batches and heads
    (as a data- and tensor-parallel mesh gives it) drops what one process's whole tensors drop there."""
    g = torch.Generator().manual_seed(13)
    B, T, H, Hkv, D = 3, 41, 4, 2, 16
    q, k, v = (torch.randn(B, T, h, D, generator=g) for h in (H, Hkv, Hkv))
    do = torch.randn(B, T, H, D, generator=g)
    options = dict(dropout=0.3, dropout_seed=5, causal=True)
    whole = [x.clone().requires_grad_() for x in (q, k, v)]
    o = rt.attention(*whole, **options)
    o.backward(do)
    part = lambda x, heads: shard(x[1:, :, heads], "zigzag").contiguous()  # noqa: E731
    mine = [part(x, heads).requires_grad_() for x, heads in ((q, slice(2, 4)), (k, slice(1, 2)), (v, slice(1, 2)))]
    o_ring = rt.ring_attention(*mine, **RING, layout="zigzag", batch_offset=1, head_offset=2, **options)
    o_ring.backward(part(do, slice(2, 4)))
    close(o_ring, part(o.detach(), slice(2, 4)), 1e-5)
    for got, want, heads in zip(mine, whole, (slice(2, 4), slice(1, 2), slice(1, 2))):
        close(got.grad, part(want.grad, heads), 1e-5)


def test_torch_compile_traces_the_ring():
    g = torch.Generator().manual_seed(12)
    q, k, v = (shard(torch.randn(1, 40, 2, 8, generator=g), "zigzag").requires_grad_() for _ in range(3))
    # Not fullgraph: resolving the mpi4py communicator to the op's handle happens outside the graph.
    fn = torch.compile(lambda q, k, v: rt.ring_attention(q, k, v, **RING, causal=True), backend="aot_eager")
    fn(q, k, v).sum().backward()
    want = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    rt.ring_attention(*want, **RING, causal=True).sum().backward()
    for got, ref in zip((q, k, v), want):
        close(got.grad, ref.grad, 1e-6)


def test_a_group_for_cuda_tensors_without_a_usable_gpu_fails_on_every_rank():
    """CUDA tensors under torchrun make the group's NCCL communicator (its unique id broadcast by the group):
    where it cannot be made (no CUDA back end, no GPU) every rank raises, none waits in the broadcast."""
    if "group" not in RING or torch.cuda.is_available():
        pytest.skip("under torchrun without a GPU only")
    with pytest.raises(ValueError, match="no CUDA back end|NCCL|CUDA|cuda"):
        rt._nccl_comm_of(None, torch.device("cuda", 0), 10.0)



def check_ring_varlen_equals_one_process(ring, layout, causal, device="cpu", dtype=torch.float32, tol=1e-5,
                                         lengths=(5, 1, 0, 9, 3, 12, 7), D=16):
    """A packed batch of documents (cu_seqlens, FlashAttention's varlen shapes) cut over the ring by layout:
    each rank's rows of o, lse and the gradients of a loss reading both (and sinks') equal one process's
    attention_varlen (itself checked against the f64 reference in test_torch_varlen.py)."""
    g = torch.Generator().manual_seed(14)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    total, H, Hkv = int(cu[-1]), 4, 2
    q, k, v, do = (torch.randn(total, h, D, generator=g).to(device, dtype) for h in (H, Hkv, Hkv, H))
    dlse, sinks = torch.randn(H, total, generator=g).to(device), torch.randn(H, generator=g).to(device)
    options = dict(causal=causal, window=(max(lengths) // 2, -1), softcap=4.0, return_lse=True)
    whole = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    o, lse = rt.attention_varlen(*whole[:3], cu, cu, sinks=whole[3], **options)
    ((o * do).sum() + (lse * dlse).sum()).backward()
    mine = [shard(x, layout, axis=0).clone().requires_grad_() for x in (q, k, v)] + [sinks.clone().requires_grad_()]
    o_ring, lse_ring = rt.ring_attention_varlen(*mine[:3], cu, cu, **ring, layout=layout, sinks=mine[3], **options)
    ((o_ring * shard(do, layout, axis=0)).sum() + (lse_ring * shard(dlse, layout)).sum()).backward()
    close(o_ring.cpu(), shard(o, layout, axis=0).cpu(), tol)
    close(lse_ring.cpu(), shard(lse, layout).cpu(), tol)
    for got, want in zip(mine[:3], whole[:3]):
        close(got.grad.cpu(), shard(want.grad, layout, axis=0).cpu(), tol)
    close(summed_over_ranks(mine[3].grad).cpu(), whole[3].grad.cpu(), tol)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention_varlen_shards_equal_one_process(layout, causal):
    check_ring_varlen_equals_one_process(RING, layout, causal)


@pytest.mark.skipif(SIZE == 1, reason="one rank has no other to tell")
@pytest.mark.parametrize("bad, reason", [
    ("qkv_format", "qkv_format"),                          # ringattn.torch's own checks
    ("varlen_lengths", "cu_seqlens_q must start at 0"),    # ring_attention_varlen's
    ("k_head_dim", "k dimension 3 (head_dim) is 8, expected 16"),  # the ring's, at the call's start
])
def test_one_ranks_bad_argument_stops_every_rank_at_once_quoting_it(bad, reason):
    # The last rank's argument is bad: it raises its own error, and every other rank raises at once too,
    # naming that rank and quoting its reason, instead of waiting for it until the timeout.
    mine = RANK == SIZE - 1
    q, k, v = (torch.randn(1, 4 * SIZE, 2, 16) for _ in range(3))
    q, k, v = (shard(x, "zigzag") for x in (q, k, v))
    start = time.monotonic()
    with pytest.raises(ValueError) as raised:
        if bad == "varlen_lengths":
            cu = [0, 4 * SIZE] if not mine else [1, 4 * SIZE]
            rt.ring_attention_varlen(q[0], k[0], v[0], cu, cu, **RING, timeout=30)
        else:
            options = {"qkv_format": "xyz"} if mine and bad == "qkv_format" else {}
            rt.ring_attention(q, k[..., :8] if mine and bad == "k_head_dim" else k, v, **RING, timeout=30, **options)
    assert time.monotonic() - start < 10
    message = str(raised.value)
    assert reason in message, message
    if not mine:
        assert f"rank {SIZE - 1} of {SIZE} refused its part of the call" in message, message
    assert rt.ring_attention(q, k, v, **RING).shape == q.shape  # nothing of the refused call is left in flight
