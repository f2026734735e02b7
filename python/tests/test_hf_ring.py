"""ringattn.hf's ring (attn_implementation="ringattn_ring"): a Hugging Face Transformers model on every rank,
each given its shard of input_ids and position_ids (ringattn.hf.shard_inputs), gives that shard's rows of
the logits of one process's f64 eager model on the whole sequence, and, the ranks' parameter gradients
summed, that model's gradients: Llama (GQA) causal in each layout, with padding and with packed sequences
(position_ids restarting), Gemma 2 (soft cap, sliding window), gpt-oss (sinks), dropout reproducible.
Under mpirun (mpi4py) and torchrun (torch.distributed's gloo group). Skipped without PyTorch or Transformers."""

import copy
import os
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs none; run on a machine with it)")
transformers = pytest.importorskip("transformers", reason="Transformers is not installed")

import ringattn  # noqa: E402
import ringattn.hf  # noqa: E402
from test_hf import TOL, ids, twins  # noqa: E402  (also registers "ringattn" and the f64 twins' mask)
from test_torch import close  # noqa: E402

if "TORCHELASTIC_RUN_ID" in os.environ:  # under torchrun: the default process group (gloo)
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    RING = {"ring": True}
    RANK, SIZE = dist.get_rank(), dist.get_world_size()

    def summed(x):
        x = x.clone()
        dist.all_reduce(x)
        return x
else:
    from mpi4py import MPI

    RING = {"comm": MPI.COMM_WORLD}
    RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()

    def summed(x):
        return torch.as_tensor(MPI.COMM_WORLD.allreduce(x.detach().numpy()))


@pytest.fixture(scope="session", autouse=True)
def process_group_closed_at_the_end():
    yield
    if "ring" in RING and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        time.sleep(0.2)  # (test_torch_ring.py says why)


def ring_twins(config_class, layout="zigzag", **fields):
    model, reference = twins(config_class, **fields)
    model.set_attn_implementation(ringattn.hf.register("ringattn_ring_" + layout, layout=layout, **RING))
    return model, reference


def check_ring(model, reference, input_ids, layout="zigzag", valid=None, tol=TOL, **inputs):
    """This rank's logits and the ranks' summed gradients against the f64 twin on the whole sequence."""
    weights = torch.randn(*input_ids.shape, model.config.vocab_size, generator=torch.Generator().manual_seed(5))
    valid = torch.ones(input_ids.shape) if valid is None else valid
    positions = inputs.pop("position_ids", None)
    mine, my_positions = ringattn.hf.shard_inputs(input_ids, RANK, SIZE, layout, positions)
    cut = {name: ringattn.shard(x, 1, layout, RANK, SIZE) for name, x in inputs.items()}
    logits = model(input_ids=mine, position_ids=my_positions, use_cache=False, **cut).logits
    (logits * ringattn.shard(weights * valid[..., None], 1, layout, RANK, SIZE)).sum().backward()
    want = reference(input_ids=input_ids, position_ids=positions, use_cache=False, **inputs).logits
    (want * (weights * valid[..., None]).double()).sum().backward()
    keep = ringattn.shard(valid, 1, layout, RANK, SIZE).bool()
    close(logits[keep], ringattn.shard(want, 1, layout, RANK, SIZE)[keep], tol)
    for (name, p), (_, r) in zip(model.named_parameters(), reference.named_parameters()):
        close(summed(p.grad), r.grad, tol)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous", "striped"])
def test_llama_causal_in_each_layout(layout):
    model, reference = ring_twins(transformers.LlamaConfig, layout)
    check_ring(model, reference, ids(2, 24), layout)


def test_llama_padding():
    model, reference = ring_twins(transformers.LlamaConfig)
    mask = torch.ones(2, 36, dtype=torch.long)
    mask[0, 29:] = 0  # right padding
    mask[1, :5] = 0   # left padding
    check_ring(model, reference, ids(2, 36), valid=mask, attention_mask=mask)


def test_llama_packed_sequences():
    model, reference = ring_twins(transformers.LlamaConfig)
    positions = torch.stack([torch.cat([torch.arange(n) for n in (7, 1, 16, 12)]),
                             torch.cat([torch.arange(n) for n in (30, 6)])])
    check_ring(model, reference, ids(2, 36), position_ids=positions)


def test_gemma2_soft_cap_and_sliding_window():
    model, reference = ring_twins(transformers.Gemma2Config, sliding_window=5, attn_logit_softcapping=5.0,
                                  final_logit_softcapping=30.0, query_pre_attn_scalar=16,
                                  layer_types=["sliding_attention", "full_attention"])
    check_ring(model, reference, ids(1, 36))


def test_gpt_oss_sinks():
    model, reference = ring_twins(transformers.GptOssConfig, sliding_window=7, num_local_experts=2,
                                  num_experts_per_tok=1, experts_implementation="eager",
                                  layer_types=["sliding_attention", "full_attention"])
    with torch.no_grad():
        for layer in list(model.model.layers) + list(reference.model.layers):
            layer.self_attn.sinks.copy_(torch.linspace(-1.0, 2.0, 4))
    check_ring(model, reference, ids(2, 24))


def test_dropout_is_one_process_dropout():
    """Rank 0's generator as one process's, the other ranks' drawn differently: the ring takes rank 0's seed
    a call, so its shards are the rows of one process's dropout (masks keyed by global rows and keys)."""
    model, _ = ring_twins(transformers.LlamaConfig, attention_dropout=0.3)
    single = copy.deepcopy(model)
    single.set_attn_implementation("ringattn")
    model.train()
    single.train()
    x = ids(1, 24)
    mine, positions = ringattn.hf.shard_inputs(x, RANK, SIZE)
    torch.manual_seed(100 + RANK)  # ranks' generators differ, as in data-parallel training
    logits = model(input_ids=mine, position_ids=positions).logits
    torch.manual_seed(100)
    want = single(input_ids=x).logits
    close(logits, ringattn.shard(want, 1, "zigzag", RANK, SIZE))
    single.eval()
    assert not torch.allclose(logits, ringattn.shard(single(input_ids=x).logits, 1, "zigzag", RANK, SIZE))


def test_patterns_the_ring_cannot_shard_are_refused():
    from transformers.masking_utils import create_causal_mask

    model, _ = ring_twins(transformers.LlamaConfig)
    with pytest.raises(ValueError, match="dense T x S mask"):
        create_causal_mask(model.config, torch.zeros(1, 8, 64), None, None, torch.arange(8)[None],
                           or_mask_function=lambda b, h, q, kv: q == kv)
    mine, positions = ringattn.hf.shard_inputs(ids(1, 24), RANK, SIZE)
    with pytest.raises(ValueError, match="4-D mask"):
        model(input_ids=mine, position_ids=positions, attention_mask=torch.ones(1, 1, mine.shape[1], mine.shape[1]))
    with pytest.raises(ValueError, match="global position"):  # position_ids left out: the model counts from 0
        model(input_ids=mine)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        model(input_ids=mine, position_ids=positions, cu_seq_lens_q=torch.tensor([0, 24]))
