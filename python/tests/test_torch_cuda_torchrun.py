"""ringattn.torch.ring_attention on CUDA tensors under torchrun: the torch.distributed group carries, once,
the unique id of an NCCL communicator (ringattn.NcclComm), and the GPU ring runs over it, one GPU per rank,
without MPI. Each rank's shards of o and of dq, dk, dv (and dsinks, a shared bias's dbias summed over the
ranks) equal the same rows of one process's attention on the whole sequence, for each layout, causal or
not. Skipped without PyTorch, in a build of ringattn without CUDA, outside torchrun, or with fewer GPUs
than ranks (NCCL takes a GPU per rank).

  python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m pytest tests/test_torch_cuda_torchrun.py
"""

import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs none; run on a machine with it)")
import ringattn  # noqa: E402

if not ringattn.built_with_cuda():
    pytest.skip("this build of ringattn has no CUDA back end", allow_module_level=True)
if "TORCHELASTIC_RUN_ID" not in os.environ:
    pytest.skip("run under torchrun (torch.distributed.run)", allow_module_level=True)
if torch.cuda.device_count() < int(os.environ["WORLD_SIZE"]):
    pytest.skip(f"no CUDA device for every rank ({torch.cuda.device_count()} GPUs, {os.environ['WORLD_SIZE']} ranks; "
                "NCCL takes a GPU per rank)", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

GPU = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(GPU)
dist.init_process_group("cpu:gloo,cuda:nccl")  # before test_torch_ring's import, which would take gloo alone

import ringattn.torch as rt  # noqa: E402
from test_torch_ring import check_ring_shards_equal_one_process  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def end_process_group():
    yield
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("causal", [False, True])
def test_shards_of_the_gpu_ring_over_a_group_equal_one_process(layout, causal):
    check_ring_shards_equal_one_process({"group": None}, layout, causal, shape=(2, 203, 8, 2, 64), tol=4e-3,
                                        device=GPU, dtype=torch.float16)


def test_the_group_makes_one_nccl_communicator_per_device():
    q = torch.randn(1, 16, 2, 64, device=GPU, dtype=torch.float16)
    for _ in range(2):
        rt.ring_attention(q, q, q, group=None, global_q_len=16 * dist.get_world_size(),
                          global_kv_len=16 * dist.get_world_size())
    made = [c for c in rt._group_comms.values() if isinstance(c, ringattn.NcclComm)]
    assert len(made) == 1 and made[0].size == dist.get_world_size() and made[0].device == GPU.index
