"""ring_attention over mpi4py, run by CTest under mpirun at 1-4 ranks: every rank's shard of the ring's
output and gradients equals the same rows of the single-process result (and the f64 reference), for each
layout and option set, uneven lengths and GQA; shard / unshard round trips; bad input raises on every
rank before any exchange. Every rank runs every test (the ring's calls are collective)."""

import itertools

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


def local_options(extra, layout, rank=RANK, size=SIZE):
    """Rank `rank`'s share (of `size`) of the per-row options (bias / mask rows, segment ids)."""
    out = dict(extra)
    for name, axis in (("bias", 2), ("mask", 2)):
        if name in out and out[name].shape[axis] != 1:
            out[name] = ringattn.shard(out[name], axis, layout, rank, size)
    if "segment_ids" in out:
        out["kv_segment_ids"] = ringattn.shard(out.get("kv_segment_ids", out["segment_ids"]), 1, layout, rank, size)
        out["segment_ids"] = ringattn.shard(out["segment_ids"], 1, layout, rank, size)
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


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("name", ["everything", "shared_bias"])
def test_ring_backward_out_names_the_parameter_gradients_or_forms_none(name, deterministic):
    # out=(dq, dk, dv, dbias, dsinks) with None for a gradient not formed: the ranks still sum what they share
    # (a shared bias's dbias), and dq, dk, dv are the bits of the call that forms everything; on both the
    # default and the deterministic (exact sums) host ring.
    q, k, v, do, extra = problem(25, T=61, S=61, H=4, Hkv=2, **CASES[name])
    part = lambda x: ringattn.shard(x, 1, "zigzag", RANK, SIZE)  # noqa: E731
    opts = dict(local_options(extra, "zigzag"), deterministic=deterministic)
    o, lse = ringattn.ring_attention(part(q), part(k), part(v), comm=COMM, return_lse=True, **opts)
    g = ringattn.ring_attention_backward(part(q), part(k), part(v), o, lse, part(do), comm=COMM, **opts)
    params = [opts[n] for n in ("bias", "sinks") if n in opts]
    for named in itertools.product([True, False], repeat=len(params)):
        out = tuple(np.full(x.shape, np.nan, x.dtype) for x in (part(q), part(k), part(v)))
        out += tuple(np.full(x.shape, np.nan, np.float32) if want else None for x, want in zip(params, named))
        got = ringattn.ring_attention_backward(part(q), part(k), part(v), o, lse, part(do), comm=COMM, out=out, **opts)
        assert all(a is b for a, b in zip(got, out))
        for mine, theirs in zip(got, g):
            if mine is not None:
                np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("qkv_format, len_axis, axes", [("bhsd", 2, (0, 2, 1, 3)), ("sbhd", 0, (1, 0, 2, 3))])
def test_ring_in_another_qkv_format_gives_bshd_bits(qkv_format, len_axis, axes):
    # Each rank's shard cut along the format's len axis: o and the gradients are the bshd ring's, reordered.
    q, k, v, do, extra = problem(23, T=45, S=45, H=4, Hkv=2, causal=True, with_sinks=True)
    part = lambda x: ringattn.shard(x, 1, "zigzag", RANK, SIZE)  # noqa: E731
    o, lse = ringattn.ring_attention(part(q), part(k), part(v), comm=COMM, return_lse=True, **extra)
    g = ringattn.ring_attention_backward(part(q), part(k), part(v), o, lse, part(do), comm=COMM, **extra)
    to = lambda x: np.ascontiguousarray(x.transpose(axes))  # noqa: E731
    part_f = lambda x: ringattn.shard(to(x), len_axis, "zigzag", RANK, SIZE)  # noqa: E731
    o_f, lse_f = ringattn.ring_attention(part_f(q), part_f(k), part_f(v), comm=COMM, return_lse=True,
                                         qkv_format=qkv_format, **extra)
    assert np.array_equal(o_f, to(o)) and np.array_equal(lse_f, lse)
    g_f = ringattn.ring_attention_backward(part_f(q), part_f(k), part_f(v), o_f, lse_f, part_f(do), comm=COMM,
                                           qkv_format=qkv_format, **extra)
    for got, want in zip(g_f[:3], g[:3]):
        assert np.array_equal(got, to(want))
    assert np.array_equal(g_f[3], g[3])  # dsinks


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_shard_unshard_round_trip(layout):
    x = np.arange(2 * 23 * 3).reshape(2, 23, 3)
    parts = [ringattn.shard(x, 1, layout, r, SIZE) for r in range(SIZE)]
    assert sum(p.shape[1] for p in parts) == 23
    np.testing.assert_array_equal(ringattn.unshard(parts, 1, layout), x)


def test_shard_and_unshard_refuse_what_names_no_shard():
    x = np.arange(2 * 11 * 3).reshape(2, 11, 3)
    np.testing.assert_array_equal(ringattn.shard(x, -2, "zigzag", 0, 3), ringattn.shard(x, 1, "zigzag", 0, 3))
    for args, pattern in [
        ((x, 3, "zigzag", 0, 2), r"shard: axis 3 is not a dimension of an array of shape \(2, 11, 3\)"),
        ((x, 1.0, "zigzag", 0, 2), "shard: axis 1.0 is not a dimension"),
        ((x, 1, "zigzag", 2, 2), "shard: rank 2 of size 2, expected 0 <= rank < size"),
        ((x, 1, "zigzag", 0, 0), "shard: rank 0 of size 0"),
        ((x, 1, "ZIGZAG", 0, 2), "layout 'ZIGZAG' is unknown"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            ringattn.shard(*args)
    parts = [ringattn.shard(x, 1, "zigzag", r, 3) for r in range(3)]  # 3, 4 and 4 rows
    with pytest.raises(ValueError, match="unshard: shard 0 has 4 rows along axis 1, but the zigzag layout of 11 rows "
                                         "over 3 ranks gives rank 0 3: pass every rank's shard, in rank order"):
        ringattn.unshard(parts[::-1], 1, "zigzag")
    with pytest.raises(ValueError, match="unshard: no shards"):
        ringattn.unshard([], 1, "zigzag")


def test_deterministic_gives_the_same_bits_for_every_ring_size():
    q, k, v, do, extra = problem(9, T=37, S=37, H=4, Hkv=2, **CASES["everything"])
    results = []
    for n in range(1, SIZE + 1):  # the ring of the first n ranks
        member = RANK < n
        ring = COMM.Split(0 if member else MPI.UNDEFINED, RANK)
        mine = None
        if member:
            cut = lambda x, axis=1: ringattn.shard(x, axis, "striped", RANK, n)  # noqa: E731
            opts = local_options(extra, "striped", RANK, n)
            o, lse = ringattn.ring_attention(cut(q), cut(k), cut(v), comm=ring, layout="striped", deterministic=True,
                                             return_lse=True, **opts)
            g = ringattn.ring_attention_backward(cut(q), cut(k), cut(v), o, lse, cut(do), comm=ring, layout="striped",
                                                 deterministic=True, **opts)
            mine = (o, lse) + tuple(g)  # o, lse, dq, dk, dv, dbias (this rank's rows), dsinks (the sum)
            ringattn.release_rings()  # collective over this ring's ranks
            ring.Free()
        shards = COMM.allgather(mine)[:n]
        axes = (1, 2, 1, 1, 1, 2)
        whole = [ringattn.unshard([s[i] for s in shards], axis, "striped") for i, axis in enumerate(axes)]
        results.append(whole + [shards[0][-1]])
    for n, got in enumerate(results[1:], start=2):
        for name, a, b in zip(("o", "lse", "dq", "dk", "dv", "dbias", "dsinks"), results[0], got):
            assert np.array_equal(a, b), "ring of %d ranks: %s differs from one rank's in %d values" % (
                n, name, int((a != b).sum()))
    # And one rank's gradients are right (against the single-process ones, within f32 rounding).
    o1, lse1 = ringattn.attention(q, k, v, return_lse=True, **extra)
    g1 = ringattn.attention_backward(q, k, v, o1, lse1, do, **extra)
    for got, want in zip(results[0][2:], g1):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_grad_wire_bf16_rounds_the_sums_in_flight():
    q, k, v, do, extra = problem(12, T=40, S=40, H=4, Hkv=2, causal=True)
    cut = lambda x: ringattn.shard(x, 1, "zigzag", RANK, SIZE)  # noqa: E731
    o, lse = ringattn.ring_attention(cut(q), cut(k), cut(v), comm=COMM, return_lse=True, **extra)
    f32 = ringattn.ring_attention_backward(cut(q), cut(k), cut(v), o, lse, cut(do), comm=COMM, **extra)
    bf16 = ringattn.ring_attention_backward(cut(q), cut(k), cut(v), o, lse, cut(do), comm=COMM, grad_wire="bf16",
                                            **extra)
    np.testing.assert_array_equal(bf16[0], f32[0])  # dq never travels
    for a, b in zip(bf16[1:], f32[1:]):  # dk, dv: within bf16's rounding of the running sums
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2 * float(np.abs(b).max()))
    with pytest.raises(ValueError, match="grad_wire 'f16': expected f32 or bf16"):
        ringattn.ring_attention_backward(cut(q), cut(k), cut(v), o, lse, cut(do), comm=COMM, grad_wire="f16", **extra)
    ringattn.release_rings()


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



def test_a_refused_call_raises_its_own_error_where_the_ranks_agreement_fails_too():
    class Broken:  # carried by Python (an object with ring_shift), failing every message
        rank, size = 0, 2

        def ring_shift(self, send, recv, tag):
            raise AssertionError("no exchange may start")

        def all_reduce(self, values, dtype, op):
            raise AssertionError("no agreement can be reached")

    q, k, v, _, _ = problem(3, T=16, S=16)
    with pytest.raises(ValueError, match="layout 'diagonal'"):
        ringattn.ring_attention(q, k, v, comm=Broken(), layout="diagonal")
    with pytest.raises(ValueError, match="no agreement can be reached"):
        ringattn.ring_attention(q, k, v, comm=Broken())


@pytest.mark.skipif(SIZE == 1, reason="one rank has no other to tell")
@pytest.mark.parametrize("bad, reason", [
    ("out_beside_format", "out= takes contiguous"),            # refused by the Python layer's own checks
    ("bias_rank", "bias has 5 dimensions, expected 4"),        # by the binding's
    ("unknown_option", "unknown option 'casual'"),
    ("k_head_dim", "k dimension 3 (head_dim) is 8, expected 32"),  # by the ring's, at the call's start
    ("out_shape", "output o has shape"),
    ("out_is_q", "output o shares memory with input q"),
    ("deterministic_str", "deterministic is 'no' of type str: expected a bool"),  # by the Python layer's
    ("global_len_float", "global_q_len is 12.5 of type float: expected None or an integer"),
    ("do_dtype", "do has dtype f16, expected f32"),
])
def test_one_ranks_bad_argument_stops_every_rank_at_once_quoting_it(bad, reason):
    # The last rank's argument is bad: it raises its own error, and every other rank raises at once too,
    # naming that rank and quoting its reason, instead of waiting for it until the timeout.
    import time

    q, k, v, do, _ = problem(7, B=1, T=3 * SIZE, S=3 * SIZE)
    q, k, v, do = (ringattn.shard(x, 1, "zigzag", RANK, SIZE) for x in (q, k, v, do))
    mine, good_k = RANK == SIZE - 1, k
    options, out = {}, None
    if mine and bad == "bias_rank":
        options["bias"] = np.zeros((1, 1, 3, 3 * SIZE, 1), np.float32)
    if mine and bad == "out_beside_format":
        options["qkv_format"], out = "sbhd", (np.empty_like(q), np.empty((1, q.shape[2], q.shape[1]), np.float32))
    if mine and bad == "unknown_option":
        options["casual"] = True
    if mine and bad == "k_head_dim":
        k = np.ascontiguousarray(k[..., :8])
    if mine and bad == "out_is_q":
        q = q.copy()  # (the ring goes on with it below)
        out = (q, np.empty((1, q.shape[2], q.shape[1]), np.float32))
    if mine and bad == "deterministic_str":
        options["deterministic"] = "no"
    if mine and bad == "global_len_float":
        options["global_q_len"] = 12.5
    if mine and bad == "out_shape":
        out = (np.empty(q.shape[:3] + (3,), np.float32), np.empty((1, q.shape[2], q.shape[1]), np.float32))
    start = time.monotonic()
    with pytest.raises(ValueError) as raised:
        if bad == "do_dtype":
            o, lse = ringattn.ring_attention(q, k, v, comm=COMM, return_lse=True, timeout=30)
            ringattn.ring_attention_backward(q, k, v, o, lse, do.astype(np.float16) if mine else do, comm=COMM,
                                             timeout=30)
        else:
            ringattn.ring_attention(q, k, v, comm=COMM, timeout=30, out=out, **options)
    assert time.monotonic() - start < 10
    message = str(raised.value)
    assert reason in message, message
    if not mine:
        assert f"rank {SIZE - 1} of {SIZE} refused its part of the call" in message, message
    # Nothing of the refused call is left in flight: the ring goes on.
    assert ringattn.ring_attention(q, good_k, v, comm=COMM).shape == q.shape


@pytest.mark.skipif(SIZE == 1, reason="one rank cannot differ from another")
@pytest.mark.parametrize("differing", [{"causal": True}, {"window": (3, 0)}, {"local_impl": "sdpa"}, {"bias": True}])
def test_options_that_differ_between_ranks_are_refused_on_every_rank(differing):
    # As the CLI's ranks started with different command lines: one rank's options alone (here the last's) stop
    # every rank with the same message, before any block moves, instead of rows computed under other options.
    q, k, v, _, _ = problem(4, B=1, T=3 * SIZE, S=3 * SIZE)
    q, k, v = (ringattn.shard(x, 1, "zigzag", RANK, SIZE) for x in (q, k, v))
    options = dict(differing) if RANK == SIZE - 1 else {}
    if options.pop("bias", False):
        options["bias"] = np.zeros((1, 1, 1, 3 * SIZE), np.float32)
    with pytest.raises(ValueError, match="the ranks called the ring with different options"):
        ringattn.ring_attention(q, k, v, comm=COMM, timeout=10, **options)

@pytest.mark.skipif(SIZE == 1, reason="one rank cannot differ from another")
def test_ranks_that_differ_in_the_sinks_gradient_they_ask_for_are_refused_on_every_rank():
    # The ranks sum dsinks together: one rank's out= without it (the last's) stops every rank by name.
    q, k, v, do, extra = problem(6, B=1, T=3 * SIZE, S=3 * SIZE, with_sinks=True)
    q, k, v, do = (ringattn.shard(x, 1, "zigzag", RANK, SIZE) for x in (q, k, v, do))
    o, lse = ringattn.ring_attention(q, k, v, comm=COMM, return_lse=True, **extra)
    out = tuple(np.empty_like(x) for x in (q, k, v)) + (None if RANK == SIZE - 1 else np.empty(4, np.float32),)
    with pytest.raises(ValueError, match="the ranks called the ring with different options"):
        ringattn.ring_attention_backward(q, k, v, o, lse, do, comm=COMM, timeout=10, out=out, **extra)


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


def test_ring_stats_say_what_the_last_call_did():
    q, k, v, do, _ = problem(23, T=64, S=64, H=2, Hkv=2)
    part = lambda x, layout: ringattn.shard(x, 1, layout, RANK, SIZE)
    # Causal over contiguous shards: rank r's queries see no key of the ranks after it.
    o, lse = ringattn.ring_attention(part(q, "contiguous"), part(k, "contiguous"), part(v, "contiguous"), comm=COMM,
                                     layout="contiguous", causal=True, return_lse=True)
    stats = ringattn.ring_stats()
    assert stats["steps"] == SIZE and stats["skipped"] == SIZE - 1 - RANK
    assert stats["transport"] == "mpi" and stats["compute_seconds"] >= 0 and stats["wait_seconds"] >= 0
    # A window of one key each side over striped shards: only the blocks of the neighbouring ranks are seen.
    ringattn.ring_attention(part(q, "striped"), part(k, "striped"), part(v, "striped"), comm=COMM, layout="striped",
                            window=(1, 1))
    assert ringattn.ring_stats()["skipped"] == max(SIZE - 3, 0)
    ringattn.ring_attention_backward(part(q, "contiguous"), part(k, "contiguous"), part(v, "contiguous"), o, lse,
                                     part(do, "contiguous"), comm=COMM, layout="contiguous", causal=True)
    assert ringattn.ring_stats()["skipped"] == SIZE - 1 - RANK
