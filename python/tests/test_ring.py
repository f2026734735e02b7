"""ring_attention over mpi4py, run by CTest under mpirun at 1-4 ranks: every rank's shard of the ring's
output and gradients equals the same rows of the single-process result (and the f64 reference), for each
layout and option set, uneven lengths and GQA; shard / unshard round trips; bad input raises on every
rank before any exchange. Every rank runs every test (the ring's calls are collective)."""

import numpy as np
import pytest
from mpi4py import MPI

import ringattn
import reference
from test_core import problem

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()

CASES = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window": (7, 3)},
    "everything": {"causal": True, "softcap": 4.0, "with_sinks": True, "with_bias": True, "with_mask": True,
                   "with_segments": True},
    "shared_bias": {"with_shared_bias": True, "causal": True},
}


def local_options(extra, layout):
    """This rank's share of the per-row options (bias / mask rows, segment ids)."""
    out = dict(extra)
    T = None
    for name, axis in (("bias", 2), ("mask", 2)):
        if name in out and out[name].shape[axis] != 1:
            out[name] = ringattn.shard(out[name], axis, layout, RANK, SIZE)
    if "segment_ids" in out:
        out["kv_segment_ids"] = ringattn.shard(out.get("kv_segment_ids", out["segment_ids"]), 1, layout, RANK, SIZE)
        out["segment_ids"] = ringattn.shard(out["segment_ids"], 1, layout, RANK, SIZE)
    return out


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("name", list(CASES))
def test_ring_equals_one_process(layout, name):
    q, k, v, do, extra = problem(21, T=61, S=61, H=4, Hkv=2, **CASES[name])
    o1, lse1 = ringattn.attention(q, k, v, return_lse=True, **extra)
    g1 = ringattn.attention_backward(q, k, v, o1, lse1, do, **extra)
    part = lambda x: ringattn.shard(x, 1, layout, RANK, SIZE)
    opts = local_options(extra, layout)
    o, lse = ringattn.ring_attention(part(q), part(k), part(v), comm=COMM, layout=layout, return_lse=True, **opts)
    g = ringattn.ring_attention_backward(part(q), part(k), part(v), o, lse, part(do), comm=COMM, layout=layout, **opts)
    np.testing.assert_allclose(o, part(o1), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(lse, ringattn.shard(lse1, 2, layout, RANK, SIZE), rtol=1e-5, atol=2e-6)
    # dq, dk, dv are this rank's rows; dbias its rows (or the whole shared row); dsinks the sum.
    np.testing.assert_allclose(g[0], part(g1[0]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g[1], part(g1[1]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g[2], part(g1[2]), rtol=1e-4, atol=1e-5)
    rest = list(g[3:])
    if "bias" in extra:
        want = g1[3] if extra["bias"].shape[2] == 1 else ringattn.shard(g1[3], 2, layout, RANK, SIZE)
        np.testing.assert_allclose(rest.pop(0), want, rtol=1e-4, atol=1e-5)
    if "sinks" in extra:
        np.testing.assert_allclose(rest.pop(0), g1[-1], rtol=1e-4, atol=1e-5)
    # And the gathered o against the f64 reference.
    gathered = ringattn.unshard(COMM.allgather(o), 1, layout)
    np.testing.assert_allclose(gathered, reference.forward(q, k, v, **extra)[0], rtol=1e-4, atol=2e-5)


def test_gqa_and_s_not_t():
    q, k, v, do, extra = problem(5, T=33, S=70, H=8, Hkv=1, causal=True)
    o1, lse1 = ringattn.attention(q, k, v, return_lse=True, **extra)
    qs = ringattn.shard(q, 1, "zigzag", RANK, SIZE)
    ks, vs = (ringattn.shard(x, 1, "zigzag", RANK, SIZE) for x in (k, v))
    o, lse = ringattn.ring_attention(qs, ks, vs, comm=COMM, return_lse=True, **extra)
    np.testing.assert_allclose(o, ringattn.shard(o1, 1, "zigzag", RANK, SIZE), rtol=1e-5, atol=2e-6)
    dq, dk, dv = ringattn.ring_attention_backward(qs, ks, vs, o, lse, ringattn.shard(do, 1, "zigzag", RANK, SIZE),
                                                  comm=COMM, **extra)
    g1 = ringattn.attention_backward(q, k, v, o1, lse1, do, **extra)
    np.testing.assert_allclose(dk, ringattn.shard(g1[1], 1, "zigzag", RANK, SIZE), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_shard_unshard_round_trip(layout):
    x = np.arange(2 * 23 * 3).reshape(2, 23, 3)
    parts = [ringattn.shard(x, 1, layout, r, SIZE) for r in range(SIZE)]
    assert sum(p.shape[1] for p in parts) == 23
    np.testing.assert_array_equal(ringattn.unshard(parts, 1, layout), x)


def test_bad_input_raises_on_every_rank():
    q, k, v, _, _ = problem(3, T=16, S=16)
    with pytest.raises(ValueError, match="layout 'diagonal'"):
        ringattn.ring_attention(q, k, v, comm=COMM, layout="diagonal")
    with pytest.raises(ValueError, match="expected an mpi4py communicator"):
        ringattn.ring_attention(q, k, v, comm=42)
    # Every rank passes the whole sequence but declares it as the global one: the shard is too long.
    if SIZE > 1:
        with pytest.raises(ValueError, match=r"q has 16 rows \(dimension 1\) on rank"):
            ringattn.ring_attention(q, k, v, comm=COMM, layout="contiguous", global_q_len=16, global_kv_len=16)


def test_a_ring_is_kept_per_configuration_and_communicator_and_released_on_request():
    ringattn.release_rings()
    q, k, v, _, _ = problem(31, T=40, S=40)
    part = lambda x: ringattn.shard(x, 1, "zigzag", RANK, SIZE)  # noqa: E731
    first = ringattn.ring_attention(part(q), part(k), part(v), comm=COMM, causal=True)
    for _ in range(2):  # the same configuration: the kept ring, the same result
        np.testing.assert_array_equal(ringattn.ring_attention(part(q), part(k), part(v), comm=COMM, causal=True), first)
    assert ringattn._core.kept_ring_count() == 1
    ringattn.ring_attention(part(q), part(k), part(v), comm=COMM, layout="zigzag", local_impl="sdpa")
    assert ringattn._core.kept_ring_count() == 2
    # A communicator over the same ranks in the same order reuses its ring; one over other ranks does not.
    same = COMM.Dup()
    ringattn.ring_attention(part(q), part(k), part(v), comm=same, causal=True)
    assert ringattn._core.kept_ring_count() == 2
    reversed_ranks = COMM.Split(0, SIZE - 1 - RANK)
    mine = lambda x: ringattn.shard(x, 1, "zigzag", reversed_ranks.Get_rank(), SIZE)  # noqa: E731
    got = ringattn.ring_attention(mine(q), mine(k), mine(v), comm=reversed_ranks, causal=True)
    np.testing.assert_allclose(got, mine(ringattn.attention(q, k, v, causal=True)), rtol=1e-5, atol=2e-6)
    assert ringattn._core.kept_ring_count() == (2 if SIZE == 1 else 3)
    # Past the kept ones, calls build their own ring and still agree.
    for layout in ("contiguous", "striped"):
        cut = lambda x: ringattn.shard(x, 1, layout, RANK, SIZE)  # noqa: E731
        got = ringattn.ring_attention(cut(q), cut(k), cut(v), comm=COMM, layout=layout, causal=True)
        np.testing.assert_allclose(got, cut(ringattn.attention(q, k, v, causal=True)), rtol=1e-5, atol=2e-6)
    assert ringattn._core.kept_ring_count() == 4
    ringattn.release_rings()
    assert ringattn._core.kept_ring_count() == 0
    same.Free()
    reversed_ranks.Free()
