"""ringattn.torch.attention_varlen (FlashAttention's varlen shapes: packed sequences and cu_seqlens) on CPU
tensors: o, lse and the gradients of a loss reading both equal the f64 numpy reference run on each sequence
alone (its own causal / window alignment), for packed batches of every kind: equal query and key lengths,
cached keys in one sequence or in several, empty sequences and queries without keys. Bad lengths raise
ValueError naming them. Skipped where PyTorch is not installed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs none; run on a machine with it)")

import ringattn.torch as rt  # noqa: E402
import reference  # noqa: E402
from test_torch import close  # noqa: E402


def cumulative(lengths):
    return [0] + list(np.cumsum(lengths).astype(int))


def packed(seed, lq, lk, H=4, Hkv=2, D=16, Dv=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lq), sum(lk)
    q = torch.randn(tq, H, D, generator=g, dtype=dtype)
    k = torch.randn(tk, Hkv, D, generator=g, dtype=dtype)
    v = torch.randn(tk, Hkv, Dv, generator=g, dtype=dtype)
    do = torch.randn(tq, H, Dv, generator=g, dtype=dtype)
    dlse = torch.randn(H, tq, generator=g, dtype=dtype)
    sinks = torch.randn(H, generator=g)
    return q, k, v, do, dlse, sinks


def per_sequence_reference(q, k, v, do, dlse, lq, lk, sinks=None, **options):
    """o, lse (H, total_q) and dq, dk, dv, dsinks in f64, each sequence alone (numpy reference)."""
    cq, ck = cumulative(lq), cumulative(lk)
    H, Dv = q.shape[1], v.shape[2]
    o = np.zeros((q.shape[0], H, Dv))
    lse = np.full((H, q.shape[0]), -np.inf)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    dsinks = np.zeros(H)
    f64 = lambda x: x.detach().double().cpu().numpy()  # noqa: E731
    s_np = None if sinks is None else f64(sinks)
    for i in range(len(lq)):
        rows, keys = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        if lq[i] == 0:
            continue
        if lk[i] == 0:  # queries that see no key: o = 0; only a sink's logit, if any (d lse / d sink = 1)
            if sinks is not None:
                lse[:, rows] = s_np[:, None]
                dsinks += f64(dlse[:, rows]).sum(axis=1)
            continue
        args = [f64(x[None]) for x in (q[rows], k[keys], v[keys])]
        o_i, lse_i, _ = reference.forward(*args, sinks=s_np, **options)
        g = reference.backward(*args, f64(do[rows][None]), sinks=s_np, dlse=f64(dlse[:, rows][None]), **options)
        o[rows], lse[:, rows] = o_i[0], lse_i[0]
        dq[rows], dk[keys], dv[keys] = g[0][0], g[1][0], g[2][0]
        if sinks is not None:
            dsinks += g[4]
    return o, lse, dq, dk, dv, dsinks


def run_varlen(q, k, v, do, dlse, lq, lk, sinks=None, **options):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.clone().requires_grad_()
    o, lse = rt.attention_varlen(*leaves, torch.tensor(cumulative(lq), dtype=torch.int32),
                                 torch.tensor(cumulative(lk), dtype=torch.int32), max(lq), max(lk), sinks=sink_leaf,
                                 return_lse=True, **options)
    assert o.shape == (q.shape[0], q.shape[1], v.shape[2]) and lse.shape == (q.shape[1], q.shape[0])
    finite = torch.isfinite(lse)
    ((o * do).sum() + (torch.where(finite, lse, 0.0) * dlse).sum()).backward()
    return o, lse, [x.grad for x in leaves], None if sink_leaf is None else sink_leaf.grad


def check_against_reference(lq, lk, seed=1, impl="flash_attn2", with_sinks=False, **options):
    q, k, v, do, dlse, sinks = packed(seed, lq, lk)
    sinks = sinks if with_sinks else None
    o, lse, grads, dsinks = run_varlen(q, k, v, do, dlse, lq, lk, sinks, impl=impl, **options)
    want = per_sequence_reference(q, k, v, do, dlse, lq, lk, sinks, **options)
    close(o, torch.from_numpy(want[0]))
    assert torch.equal(torch.isfinite(lse), torch.from_numpy(np.isfinite(want[1])))  # -inf where nothing is seen
    close(torch.where(torch.isfinite(lse), lse, 0.0), torch.from_numpy(np.where(np.isfinite(want[1]), want[1], 0.0)))
    for got, ref in zip(grads, want[2:5]):
        assert torch.isfinite(got).all()
        close(got, torch.from_numpy(ref))
    if with_sinks:
        close(dsinks, torch.from_numpy(want[5]))


OPTIONS = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window": (3, 2)},
    "causal_window_softcap_sinks": {"causal": True, "window": (4, 0), "softcap": 5.0, "with_sinks": True},
}
# (query lengths, key lengths) and whether one call of batch 1 is each sequence's own attention
BATCHES = {
    "equal": ([5, 1, 9, 3], [5, 1, 9, 3]),
    "empty_sequences": ([0, 7, 0, 4], [0, 7, 0, 4]),
    "cached_keys_first": ([3, 6, 2], [8, 6, 2]),  # extra keys in the first sequence only: one call
    "cached_keys_each": ([3, 6, 2], [5, 6, 7]),  # different extra keys: one call a sequence with causal
    "queries_without_keys": ([4, 3, 2], [6, 0, 2]),
    "more_queries_than_keys": ([6, 5], [2, 5]),  # causal aligned to the end: the first rows see nothing
}


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("name", list(OPTIONS))
def test_each_sequence_equals_the_f64_reference_alone(batch, name):
    lq, lk = BATCHES[batch]
    check_against_reference(lq, lk, **OPTIONS[name])


@pytest.mark.parametrize("impl", ["sdpa", "blockwise"])
@pytest.mark.parametrize("batch", ["equal", "cached_keys_each"])
def test_other_implementations(impl, batch):
    lq, lk = BATCHES[batch]
    check_against_reference(lq, lk, seed=3, impl=impl, causal=True, window=(5, -1))


def count_calls(monkeypatch):
    calls = []
    inner = rt.attention

    def counted(*args, **kwargs):
        calls.append(kwargs.get("segment_ids") is not None)
        return inner(*args, **kwargs)

    monkeypatch.setattr(rt, "attention", counted)
    return calls


@pytest.mark.parametrize("batch,causal,one_call", [("equal", True, True), ("cached_keys_first", True, True),
                                                  ("cached_keys_each", False, True), ("cached_keys_each", True, False)])
def test_one_call_with_segment_ids_where_the_alignments_agree(monkeypatch, batch, causal, one_call):
    calls = count_calls(monkeypatch)
    lq, lk = BATCHES[batch]
    check_against_reference(lq, lk, causal=causal)
    assert calls == ([True] if one_call else [False] * len(lq)), calls


def test_int64_lists_and_long_tensors_are_taken():
    lq = [4, 6]
    q, k, v = packed(5, lq, lq)[:3]
    want = rt.attention_varlen(q, k, v, torch.tensor([0, 4, 10], dtype=torch.int32),
                               torch.tensor([0, 4, 10], dtype=torch.int32), causal=True)
    close(rt.attention_varlen(q, k, v, [0, 4, 10], torch.tensor([0, 4, 10]), causal=True), want, 0.0)


BAD = [
    (dict(cu_q=[1, 4, 10]), "cu_seqlens_q must start at 0, not 1"),
    (dict(cu_q=[0, 6, 4, 10]), "cu_seqlens_q must be non-decreasing: entry 2 is 4 after 6"),
    (dict(cu_k=[0, 4, 9]), "cu_seqlens_k ends at 9, but k's first dimension holds 10 tokens"),
    (dict(cu_k=[0, 10]), "cu_seqlens_q has 2 sequences but cu_seqlens_k 1"),
    (dict(cu_q=[0]), "cu_seqlens_q must have at least 2 entries"),
    (dict(cu_q=torch.tensor([0.0, 4.0, 10.0])), "cu_seqlens_q must hold integers"),
    (dict(cu_q=torch.tensor([[0, 4, 10]])), "cu_seqlens_q must be 1-dimensional"),
    (dict(max_q=5), r"max_seqlen_q is 5, below the longest sequence of cu_seqlens_q \(6 tokens\)"),
    (dict(q4=True), r"q must be \(total tokens, heads, head dim\)"),
    (dict(cu_k=[0, 2, 10], dropout=0.1), "dropout with causal or window where sequences end at different distances"),
]


@pytest.mark.parametrize("case,message", BAD)
def test_bad_lengths_are_refused_by_name(case, message):
    q, k, v = packed(6, [4, 6], [4, 6])[:3]
    if case.get("q4"):
        q = q[None]
    with pytest.raises(ValueError, match=message):
        rt.attention_varlen(q, k, v, case.get("cu_q", [0, 4, 10]), case.get("cu_k", [0, 4, 10]), case.get("max_q"),
                            causal=True, dropout=case.get("dropout", 0.0))


@pytest.mark.parametrize("case,message", [c for c in BAD if "q4" not in c[0] and "dropout" not in c[0]])
def test_bad_lengths_are_refused_after_the_call_they_did_not_hold_up(monkeypatch, case, message):
    # Lengths as tensors and no causal mask: one call is sure without them, so it is queued before they are read
    # back; the bad length still raises by name (the dtype and shape checks before anything runs).
    q, k, v = packed(6, [4, 6], [4, 6])[:3]
    cu_q, cu_k = (cu if isinstance(cu, torch.Tensor) else torch.tensor(cu)
                  for cu in (case.get("cu_q", [0, 4, 10]), case.get("cu_k", [0, 4, 10])))
    calls = count_calls(monkeypatch)
    with pytest.raises(ValueError, match=message):
        rt.attention_varlen(q, k, v, cu_q, cu_k if "cu_k" in case else cu_q, case.get("max_q"))
    assert calls == ([] if "integers" in message or "1-dimensional" in message else [True]), calls


def test_equal_lengths_tensor_runs_one_call_before_its_check(monkeypatch):
    # cu_seqlens_q is cu_seqlens_k (training): one call with causal, ids made from the tensor itself, the same
    # result as from lists.
    lq = [3, 0, 5, 1]
    q, k, v = packed(8, lq, lq)[:3]
    cu = torch.tensor([0, 3, 3, 8, 9], dtype=torch.int32)
    want = rt.attention_varlen(q, k, v, [0, 3, 3, 8, 9], [0, 3, 3, 8, 9], causal=True, return_lse=True)
    calls = count_calls(monkeypatch)
    got = rt.attention_varlen(q, k, v, cu, cu, causal=True, return_lse=True)
    assert calls == [True]
    close(got[0], want[0], 0.0)
    close(got[1], want[1], 0.0)


def test_ring_varlen_refuses_sequences_the_ring_cannot_align():
    q, k, v = packed(7, [3, 6, 2], [5, 6, 7])[:3]
    with pytest.raises(ValueError, match="sequence 0 ends 2 keys past its queries' end but the batch 7"):
        rt.ring_attention_varlen(q, k, v, [0, 3, 9, 11], [0, 5, 11, 18], causal=True)


def test_torch_compile_of_a_function_calling_it_matches_eager():
    # The lengths are read on the host: a graph break, not an error, under torch.compile.
    q, k, v, do = packed(8, [5, 7, 18], [5, 7, 18])[:4]
    cu = torch.tensor([0, 5, 12, 30], dtype=torch.int32)
    grads = []
    for fn in (rt.attention_varlen, torch.compile(rt.attention_varlen, backend="aot_eager")):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        fn(*leaves, cu, cu, causal=True).backward(do)
        grads.append([x.grad for x in leaves])
    for eager, compiled in zip(*grads):
        close(compiled, eager, 1e-6)
