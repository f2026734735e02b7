"""ringattn's Python core on numpy against the f64 numpy reference (tests/reference.py): every option of
the forward and the backward, each host implementation, GQA, S != T, fully masked rows, strided views,
and errors as ValueError naming the tensor."""

import warnings

import numpy as np
import pytest

import ringattn
import reference

IMPLS = ["flash_attn2", "sdpa", "blockwise"]


def problem(seed, B=2, T=37, S=37, H=4, Hkv=2, D=32, Dv=32, dtype=np.float32, **options):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, D)).astype(dtype)
    k = rng.standard_normal((B, S, Hkv, D)).astype(dtype)
    v = rng.standard_normal((B, S, Hkv, Dv)).astype(dtype)
    do = rng.standard_normal((B, T, H, Dv)).astype(dtype)
    extra = {}
    if options.pop("with_bias", False):
        extra["bias"] = rng.standard_normal((1, H, T, S)).astype(np.float32)
    if options.pop("with_shared_bias", False):
        extra["bias"] = rng.standard_normal((1, H, 1, S)).astype(np.float32)
    if options.pop("with_mask", False):
        extra["mask"] = rng.random((B, 1, T, S)) < 0.8
    if options.pop("with_sinks", False):
        extra["sinks"] = rng.standard_normal(H).astype(np.float32)
    if options.pop("with_segments", False):
        extra["segment_ids"] = np.sort(rng.integers(0, 3, (B, T)), axis=1).astype(np.int32)
        if S != T:
            extra["kv_segment_ids"] = np.sort(rng.integers(0, 3, (B, S)), axis=1).astype(np.int32)
    extra.update(options)
    return q, k, v, do, extra


OPTION_SETS = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window": (5, 2)},
    "softcap_scale": {"softcap": 3.0, "scale": 0.3},
    "sinks": {"with_sinks": True, "causal": True},
    "bias": {"with_bias": True},
    "shared_bias": {"with_shared_bias": True},
    "mask": {"with_mask": True},
    "segments": {"with_segments": True},
    "everything": {"causal": True, "window": (9, 0), "softcap": 5.0, "with_sinks": True, "with_bias": True,
                   "with_mask": True, "with_segments": True},
}


def reference_options(extra):
    return {k: v for k, v in extra.items() if k not in ("impl",)}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_forward_and_backward_match_f64(impl, name):
    q, k, v, do, extra = problem(7, **OPTION_SETS[name])
    o, lse = ringattn.attention(q, k, v, impl=impl, return_lse=True, **extra)
    ref_o, ref_lse, _ = reference.forward(q, k, v, **reference_options(extra))
    assert o.dtype == np.float32 and o.shape == ref_o.shape and lse.shape == ref_lse.shape
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=2e-5)
    grads = ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, **extra)
    want = reference.backward(q, k, v, do, **reference_options(extra))
    names = ["dq", "dk", "dv"] + (["dbias"] if "bias" in extra else []) + (["dsinks"] if "sinks" in extra else [])
    expected = [want[0], want[1], want[2]] + ([want[3]] if "bias" in extra else []) + ([want[4]] if "sinks" in extra else [])
    assert len(grads) == len(names)
    for got, ref, what in zip(grads, expected, names):
        assert got.shape == ref.shape, what
        assert np.isfinite(got).all(), what
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(ref).max()), err_msg=what)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", ["plain", "sinks", "everything"])
def test_backward_of_a_loss_reading_lse_matches_f64(impl, name):
    # dlse = dLoss/dlse beside do (a loss that merges outputs by their lse); the fully masked rows of
    # "everything" (lse -inf) take one too and stay zero.
    q, k, v, do, extra = problem(8, T=29, S=41, **OPTION_SETS[name])
    dlse = np.random.default_rng(9).standard_normal((2, 4, 29)).astype(np.float32)
    o, lse = ringattn.attention(q, k, v, impl=impl, return_lse=True, **extra)
    grads = ringattn.attention_backward(q, k, v, o, lse, do, dlse=dlse, impl=impl, **extra)
    want = reference.backward(q, k, v, do, dlse=dlse, **reference_options(extra))
    for got, ref in zip(grads[:3], want[:3]):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(ref).max()))
    without = ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, **extra)
    assert not np.array_equal(grads[1], without[1])


def test_a_dlse_of_the_wrong_shape_or_dtype_is_refused_by_name():
    q, k, v, do, _ = problem(10, T=9, S=9)
    o, lse = ringattn.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"dlse dimension 2 \(q_len\) is 8, expected 9"):
        ringattn.attention_backward(q, k, v, o, lse, do, dlse=np.zeros((2, 4, 8), np.float32))
    with pytest.raises(ValueError, match="dlse has shape .* and dtype f16, expected contiguous f32"):
        ringattn.attention_backward(q, k, v, o, lse, do, dlse=np.zeros((2, 4, 9), np.float16))


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_f64_inputs_run_the_f64_reference_in_f64(name):
    # impl="sdpa" on float64 arrays: inputs, arithmetic and results in f64 (what finite differences need).
    q, k, v, do, extra = problem(11, T=13, S=17, **OPTION_SETS[name])
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    extra = {n: (x.astype(np.float64) if n in ("bias", "sinks") else x) for n, x in extra.items()}
    o, lse = ringattn.attention(q, k, v, impl="sdpa", return_lse=True, **extra)
    # The scale (given, or 1/sqrt(D)) and the soft cap are f32 parameters, as every implementation takes them.
    ref_extra = {n: (float(np.float32(x)) if n in ("scale", "softcap") else x) for n, x in extra.items()}
    ref_extra.setdefault("scale", float(np.float32(1) / np.sqrt(np.float32(q.shape[3]))))
    ref_o, ref_lse, _ = reference.forward(q, k, v, **ref_extra)
    assert o.dtype == np.float64 and lse.dtype == np.float64
    np.testing.assert_allclose(o, ref_o, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-13)
    grads = ringattn.attention_backward(q, k, v, o, lse, do, impl="sdpa", **extra)
    want = reference.backward(q, k, v, do, **ref_extra)
    expected = list(want[:3]) + ([want[3]] if "bias" in extra else []) + ([want[4]] if "sinks" in extra else [])
    assert len(grads) == len(expected)
    for got, ref in zip(grads, expected):
        assert got.dtype == np.float64 and got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12 * max(1.0, np.abs(ref).max()))
    f32 = ringattn.attention_backward(q, k, v, o, lse, do, impl="sdpa", f32_gradients=True, **extra)
    assert all(g.dtype == np.float32 for g in f32)


@pytest.mark.parametrize("impl", ["flash_attn2", "blockwise"])
def test_f64_inputs_name_the_implementation_that_takes_them(impl):
    q, k, v, _, _ = problem(12, T=5, S=5, dtype=np.float64)
    with pytest.raises(ValueError, match=f"f64.*impl 'sdpa' on the host.*impl '{impl}'"):
        ringattn.attention(q, k, v, impl=impl)
    with pytest.raises(ValueError, match="flash_kernel wgmma"):
        ringattn.attention(q, k, v, impl="sdpa", flash_kernel="wgmma")


@pytest.mark.parametrize("shape", [dict(T=1, S=50), dict(T=50, S=19), dict(H=8, Hkv=1), dict(D=64, Dv=16)])
def test_shapes_gqa_and_uneven_lengths(shape):
    q, k, v, do, extra = problem(3, causal=True, **shape)
    o, lse = ringattn.attention(q, k, v, return_lse=True, **extra)
    ref_o, ref_lse, _ = reference.forward(q, k, v, **extra)
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5)
    dq, dk, dv = ringattn.attention_backward(q, k, v, o, lse, do, **extra)
    want = reference.backward(q, k, v, do, **extra)
    for got, ref in zip((dq, dk, dv), want[:3]):
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(ref).max()))


def test_half_precision_inputs():
    q, k, v, do, extra = problem(5, dtype=np.float16, causal=True)
    o, lse = ringattn.attention(q, k, v, return_lse=True)
    assert o.dtype == np.float16
    ref_o, _, _ = reference.forward(q, k, v)
    np.testing.assert_allclose(o.astype(np.float64), ref_o, atol=2e-3)
    dq, dk, dv = ringattn.attention_backward(q, k, v, o, lse, do, f32_gradients=True)
    assert dq.dtype == np.float32
    want = reference.backward(q, k, v, do)
    for got, ref in zip((dq, dk, dv), want[:3]):
        np.testing.assert_allclose(got, ref, atol=2e-2 * max(1.0, np.abs(ref).max()))


def test_fully_masked_rows_give_zero_not_nan():
    q, k, v, do, extra = problem(9, T=8, S=8)
    mask = np.ones((2, 1, 8, 8), dtype=bool)
    mask[:, :, 3, :] = False  # row 3 sees no key
    o, lse = ringattn.attention(q, k, v, mask=mask, return_lse=True)
    assert np.all(o[:, 3] == 0) and np.all(np.isneginf(lse[:, :, 3]))
    grads = ringattn.attention_backward(q, k, v, o, lse, do, mask=mask)
    assert all(np.isfinite(g).all() for g in grads)
    assert np.all(grads[0][:, 3] == 0)



@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_a_nan_in_q_gives_nan_in_its_row_not_an_empty_rows_zero(impl, causal):
    # Every logit of that row is NaN: a max over them skips NaN, yet the row is not empty (PyTorch's SDPA
    # gives NaN there too). Causal: the row's masked logits (-inf) beside its NaN ones.
    q, k, v, do, _ = problem(10, T=9, S=9)
    q[1, 4, 2, 5] = np.nan
    o, lse = ringattn.attention(q, k, v, impl=impl, causal=causal, return_lse=True)
    assert np.isnan(o[1, 4, 2]).all() and np.isnan(lse[1, 2, 4])
    clean = np.ones(o.shape[:3], dtype=bool)
    clean[1, 4, 2] = False
    assert np.isfinite(o[clean]).all()
    grads = ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, causal=causal)
    assert np.isnan(grads[0][1, 4, 2]).all()  # dq of the row; dk / dv of the keys it saw carry the NaN on

def test_masks_and_biases_may_drop_leading_ones_as_numpy_broadcasts():
    q, k, v, do, _ = problem(11, T=13, S=17)
    rng = np.random.default_rng(11)
    bias = rng.standard_normal((4, 13, 17)).astype(np.float32)  # (Hq, T, S)
    mask = rng.random((13, 17)) < 0.7  # (T, S)
    mask[:, 0] = True
    for impl in IMPLS:
        o, lse = ringattn.attention(q, k, v, impl=impl, bias=bias, mask=mask, return_lse=True)
        o4, lse4 = ringattn.attention(q, k, v, impl=impl, bias=bias[None], mask=mask[None, None], return_lse=True)
        assert np.array_equal(o, o4) and np.array_equal(lse, lse4)
        grads = ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, bias=bias, mask=mask)
        grads4 = ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, bias=bias[None], mask=mask[None, None])
        assert grads[3].shape == bias.shape and np.array_equal(grads[3], grads4[3][0])
        assert all(np.array_equal(a, b) for a, b in zip(grads[:3], grads4[:3]))

def test_dropout_on_a_slice_of_batch_and_heads_with_its_offsets_drops_what_the_whole_does():
    """batch_offset / head_offset: a data- or tensor-parallel rank's slice keys dropout by global indices."""
    q, k, v, do, _ = problem(12, B=3, T=21, S=25, H=4, Hkv=2)
    options = {"dropout": 0.3, "dropout_seed": 9, "causal": True}
    for impl in IMPLS:
        o, lse = ringattn.attention(q, k, v, impl=impl, return_lse=True, **options)
        grads = ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, **options)
        part = lambda x, heads: np.ascontiguousarray(x[1:, :, heads])  # batches 1-2, the second kv group
        qs, ks, vs, dos = part(q, slice(2, 4)), part(k, slice(1, 2)), part(v, slice(1, 2)), part(do, slice(2, 4))
        for offsets, same in (({"batch_offset": 1, "head_offset": 2}, True), ({}, False)):
            os_, lses = ringattn.attention(qs, ks, vs, impl=impl, return_lse=True, **options, **offsets)
            gs = ringattn.attention_backward(qs, ks, vs, os_, lses, dos, impl=impl, **options, **offsets)
            close = [np.allclose(got, want, atol=1e-5) for got, want in
                     ((os_, part(o, slice(2, 4))), (lses, lse[1:, 2:4]), (gs[0], part(grads[0], slice(2, 4))),
                      (gs[1], part(grads[1], slice(1, 2))), (gs[2], part(grads[2], slice(1, 2))))]
            assert all(close) if same else not close[0], (impl, offsets, close)  # (lse ignores dropout)


FORMAT_AXES = {"bhsd": (0, 2, 1, 3), "sbhd": (1, 0, 2, 3)}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("qkv_format", list(FORMAT_AXES))
def test_every_qkv_format_gives_the_bits_of_bshd(impl, qkv_format):
    # The same values held (B, H, T, D) or (T, B, H, D): o and the gradients are bshd's, in the format's order.
    q, k, v, do, extra = problem(12, T=29, S=41, D=16, Dv=8, **OPTION_SETS["everything"])
    o, lse = ringattn.attention(q, k, v, impl=impl, return_lse=True, **extra)
    grads = ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, **extra)
    axes = FORMAT_AXES[qkv_format]
    to = lambda x: np.ascontiguousarray(x.transpose(axes))  # noqa: E731
    o_f, lse_f = ringattn.attention(to(q), to(k), to(v), impl=impl, return_lse=True, qkv_format=qkv_format, **extra)
    assert o_f.shape == to(o).shape and np.array_equal(o_f, to(o)) and np.array_equal(lse_f, lse)
    grads_f = ringattn.attention_backward(to(q), to(k), to(v), o_f, lse_f, to(do), impl=impl, qkv_format=qkv_format,
                                          **extra)
    assert len(grads_f) == len(grads)
    for got, want in zip(grads_f[:3], grads[:3]):
        assert got.shape == to(want).shape and np.array_equal(got, to(want))
    for got, want in zip(grads_f[3:], grads[3:]):  # dbias, dsinks: (batch, heads, ...) in every format
        assert np.array_equal(got, want)


def test_qkv_format_refusals_and_warnings():
    q, k, v, _, _ = problem(13)
    with pytest.raises(ValueError, match="qkv_format 'thd' is none of 'bshd'.*segment_ids"):
        ringattn.attention(q, k, v, qkv_format="thd")
    with pytest.raises(ValueError, match="out= takes contiguous .* leave out= out"):
        ringattn.attention(q, k, v, qkv_format="bhsd", out=(np.empty_like(q), np.empty((2, 4, 37), np.float32)))
    with pytest.raises(ValueError, match=r"k dimension 3 \(head_dim\) is 16.*qkv_format 'sbhd': shapes named as "
                                         r"\(batch, len, heads, dim\), the tensors' \(len, batch, heads, dim\)"):
        ringattn.attention(q, k[..., :16], v, qkv_format="sbhd")
    with pytest.raises(ValueError, match="q has 3 dimensions"):
        ringattn.attention(q[0], k, v, qkv_format="bhsd")
    for fmt in (None, "bhsd"):  # what is no array is named (the core's own TypeError names no argument)
        with pytest.raises(ValueError, match="k is a list, expected an array"):
            ringattn.attention(q, k.tolist(), v, qkv_format=fmt)
        with pytest.raises(ValueError, match="do is a NoneType, expected an array"):
            ringattn.attention_backward(q, k, v, q, np.zeros((2, 4, 37), np.float32), None, qkv_format=fmt)
    # Given no format: a (B, H, T, D) q of many heads, and (T, B, H, D) ones read as batch rows of one token.
    bhsd = np.zeros((1, 4, 300, 8), np.float32)
    with pytest.warns(UserWarning, match="300 heads and 4 tokens.*qkv_format='bhsd'"):
        ringattn.attention(bhsd, bhsd, bhsd)
    sbhd = np.zeros((16, 1, 2, 8), np.float32)
    with pytest.warns(UserWarning, match="16 batch rows of one query and one key.*qkv_format='sbhd'"):
        ringattn.attention(sbhd, sbhd, sbhd)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ringattn.attention(sbhd, sbhd, sbhd, qkv_format="bshd")  # said so: no warning


def test_strided_views_without_copies():
    # (B, H, T, D) arrays viewed as (B, T, H, D): the core reads them through their strides.
    q, k, v, do, _ = problem(11)
    q_bhtd = np.ascontiguousarray(q.transpose(0, 2, 1, 3))
    o_view = ringattn.attention(q_bhtd.transpose(0, 2, 1, 3), k, v, impl="sdpa")
    np.testing.assert_allclose(o_view, ringattn.attention(q, k, v, impl="sdpa"), rtol=1e-6, atol=1e-6)


def test_outputs_own_their_memory():
    q, k, v, _, _ = problem(2)
    o = ringattn.attention(q, k, v)
    copy = o.copy()
    del q, k, v
    np.testing.assert_array_equal(o, copy)  # still valid: the array owns the result


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda a: dict(a, q=a["q"][0]), "q has 3 dimensions, expected 4"),
        (lambda a: dict(a, k=a["k"][:, :, :, :16]), "dimension 3"),
        (lambda a: dict(a, q=a["q"].astype(np.int64)), "q has a dtype ringattn does not take"),
        (lambda a: dict(a, v=a["v"][:, :5]), "v"),
        (lambda a: dict(a, sinks=np.zeros(3, np.float32)), "sinks"),
        (lambda a: dict(a, window=(2,)), "window"),
        (lambda a: dict(a, casual=True), "unknown option 'casual'"),
        (lambda a: dict(a, mask_identity=5), "mask_identity 5 names a mask, but the call has none"),
        (lambda a: dict(a, head_offset=-2), "batch_offset 0 and head_offset -2: expected the global index"),
        (lambda a: dict(a, bias=[1.0, 2.0]), "bias is a list, expected an array"),
        (lambda a: dict(a, impl="nonexistent"), "nonexistent"),
        (lambda a: dict(a, stream=7), "stream is given \\(7\\) but q is in host memory"),
        (lambda a: dict(a, k=a["k"][:, :30], v=a["v"][:, :30], segment_ids=np.zeros((2, 37), np.int32)),
         "segment_ids \\(B, T\\) given without kv_segment_ids, but the keys are not the queries \\(T = 37, S = 30\\)"),
    ],
)
def test_bad_input_raises_value_error_naming_it(mutate, pattern):
    q, k, v, _, _ = problem(1)
    args = mutate(dict(q=q, k=k, v=v))
    with pytest.raises((ValueError, TypeError), match=pattern):
        ringattn.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_backward_refuses_a_mismatched_o():
    q, k, v, do, _ = problem(4)
    o, lse = ringattn.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="o"):
        ringattn.attention_backward(q, k, v, o[:, :5], lse, do)


def test_torch_arrays_come_back_as_torch():
    torch = pytest.importorskip("torch")
    q, k, v, do, _ = problem(6)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    o = ringattn.attention(tq, tk, tv, causal=True)
    assert isinstance(o, torch.Tensor)
    np.testing.assert_allclose(o.numpy(), ringattn.attention(q, k, v, causal=True), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_results_written_into_the_callers_arrays_equal_the_allocated_ones(dtype):
    q, k, v, do, _ = problem(13, T=29, S=41, dtype=dtype)
    sinks = np.linspace(-1, 1, 4).astype(np.float32)
    o, lse = ringattn.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    out = (np.full(o.shape, np.nan, np.float32), np.full(lse.shape, np.nan, np.float32))  # o in f32: allowed
    got = ringattn.attention(q, k, v, causal=True, sinks=sinks, return_lse=True, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    np.testing.assert_array_equal(out[1], lse)
    np.testing.assert_allclose(out[0], o.astype(np.float32), rtol=0, atol=1e-3 if dtype == np.float16 else 0)
    grads = ringattn.attention_backward(q, k, v, o, lse, do, causal=True, sinks=sinks)
    into = tuple(np.full(x.shape, np.nan, x.dtype) for x in (q, k, v))
    got = ringattn.attention_backward(q, k, v, o, lse, do, causal=True, sinks=sinks, out=into)
    assert all(a is b for a, b in zip(got[:3], into)) and len(got) == 4  # then dsinks, allocated
    for mine, theirs in zip(got, grads):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("impl", IMPLS)
def test_backward_out_names_the_bias_and_sinks_gradients_or_none_to_form_none(impl):
    # out=(dq, dk, dv, dbias, dsinks): the gradients written into the caller's arrays (dbias in the bias's own
    # 2-dimensional shape), or, for None, not formed at all; dq, dk, dv the same bits either way.
    q, k, v, do, _ = problem(17, T=29, S=41)
    rng = np.random.default_rng(18)
    bias, sinks = rng.standard_normal((29, 41)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    opts = dict(causal=True, bias=bias, sinks=sinks, impl=impl)
    o, lse = ringattn.attention(q, k, v, return_lse=True, **opts)
    dq, dk, dv, dbias, dsinks = ringattn.attention_backward(q, k, v, o, lse, do, **opts)
    assert dbias.shape == bias.shape and dsinks.shape == sinks.shape
    for named in [(True, True), (True, False), (False, True), (False, False)]:
        out = tuple(np.full(x.shape, np.nan, np.float32) for x in (q, k, v))
        out += tuple(np.full(x.shape, np.nan, np.float32) if want else None for x, want in zip((bias, sinks), named))
        got = ringattn.attention_backward(q, k, v, o, lse, do, out=out, **opts)
        assert len(got) == 5 and all(a is b for a, b in zip(got, out))
        for i, (mine, theirs) in enumerate(zip(got, (dq, dk, dv, dbias, dsinks))):
            if mine is not None and i == 3:  # a broadcast bias's gradient: threads add it in no fixed order
                np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
            elif mine is not None:
                np.testing.assert_array_equal(mine, theirs)
    with pytest.raises(ValueError, match=r"out must be a sequence \(dq, dk, dv\) or \(dq, dk, dv, dbias or None, "
                                         r"dsinks or None\)"):
        ringattn.attention_backward(q, k, v, o, lse, do, out=(dq, dk, dv, None), **opts)
    with pytest.raises(ValueError, match=r"output dbias has shape \(1, 1, 29, 40\), expected \(1, 1, 29, 41\)"):
        ringattn.attention_backward(q, k, v, o, lse, do, out=(dq, dk, dv, dbias[:, :40].copy(), None), **opts)
    with pytest.raises(ValueError, match="output dsinks has dtype f64, expected f32"):
        ringattn.attention_backward(q, k, v, o, lse, do, out=(dq, dk, dv, None, dsinks.astype(np.float64)), **opts)


@pytest.mark.parametrize(
    "make_out, pattern",
    [
        (lambda o, lse: (o[:, :5], lse), "output o has shape"),
        (lambda o, lse: (o.astype(np.float16), lse), "output o has dtype f16, expected f32"),
        (lambda o, lse: (o, lse.astype(np.float16)), "output lse has dtype f16, expected f32"),
        (lambda o, lse: (o.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3), lse), "output o is not contiguous"),
        (lambda o, lse: (o,), "out must be a sequence of 2 arrays"),
        (lambda o, lse: (o, "lse"), "out's lse is a str"),
    ],
)
def test_bad_output_arrays_are_refused_naming_them(make_out, pattern):
    q, k, v, _, _ = problem(14)
    o, lse = ringattn.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=pattern):
        ringattn.attention(q, k, v, return_lse=True, out=make_out(np.empty_like(o), np.empty_like(lse)))


@pytest.mark.parametrize("impl", ["sdpa", "flash_attn2", "blockwise"])
def test_outputs_that_share_memory_with_what_the_call_reads_are_refused(impl):
    # The implementations write outputs in pieces while they still read: an out= that is an input (in place) or
    # another output is refused by name, before anything is written.
    q, k, v, do, _ = problem(15, T=20, S=20)
    o, lse = ringattn.attention(q, k, v, return_lse=True, impl=impl)
    grads = ringattn.attention_backward(q, k, v, o, lse, do, impl=impl)
    shares = "output {} shares memory with {} {}: outputs need memory of their own"
    mine = q.copy()
    with pytest.raises(ValueError, match=shares.format("o", "input", "q")):
        ringattn.attention(mine, k, v, return_lse=True, impl=impl, out=(mine, np.empty_like(lse)))
    np.testing.assert_array_equal(mine, q)
    whole = np.empty(o.size + lse.size + 1, np.float32)  # lse's first element inside o's last row
    with pytest.raises(ValueError, match=shares.format("lse", "output", "o")):
        ringattn.attention(q, k, v, return_lse=True, impl=impl,
                           out=(whole[: o.size].reshape(o.shape), whole[o.size - 1 : o.size - 1 + lse.size].reshape(lse.shape)))
    for out, pattern in [
        ((np.empty_like(q), k, np.empty_like(v)), shares.format("dk", "input", "k")),
        ((np.empty_like(q), np.empty_like(k), v[:, :, :, :]), shares.format("dv", "input", "v")),
        ((do.copy(), np.empty_like(k), np.empty_like(v)), None),
        ((np.empty_like(q), np.empty_like(k), np.empty_like(v)), None),
    ]:
        if pattern is None:  # apart: taken, and the same gradients
            for mine, want in zip(ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, out=out), grads):
                np.testing.assert_array_equal(mine, want)
            continue
        with pytest.raises(ValueError, match=pattern):
            ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, out=out)
    same = np.empty_like(k)
    with pytest.raises(ValueError, match=shares.format("dv", "output", "dk")):
        ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, out=(np.empty_like(q), same, same))
    with pytest.raises(ValueError, match=shares.format("dq", "input", "do")):
        ringattn.attention_backward(q, k, v, o, lse, do, impl=impl, out=(do, np.empty_like(k), np.empty_like(v)))


def test_int64_segment_ids_are_taken_as_int32():
    q, k, v, do, _ = problem(41, T=20, S=20)
    seg = np.repeat(np.arange(4), 5)[None].repeat(2, axis=0)  # int64, numpy's default
    want = ringattn.attention(q, k, v, segment_ids=seg.astype(np.int32), kv_segment_ids=seg.astype(np.int32))
    np.testing.assert_array_equal(ringattn.attention(q, k, v, segment_ids=seg, kv_segment_ids=seg), want)
    o, lse = ringattn.attention(q, k, v, segment_ids=seg, kv_segment_ids=seg, return_lse=True)
    ringattn.attention_backward(q, k, v, o, lse, do, segment_ids=seg, kv_segment_ids=seg)
    with pytest.raises(ValueError, match="segment_ids holds values outside int32's range"):
        ringattn.attention(q, k, v, segment_ids=seg * 2**40, kv_segment_ids=seg)


def test_nccl_comm_refuses_a_bad_unique_id_by_name():
    # ringattn.NcclComm (the GPU ring's communicator under torchrun): arguments are checked before any device
    # or peer is touched; a build without CUDA says it has none.
    if not ringattn.built_with_cuda():
        with pytest.raises(ValueError, match="no CUDA back end"):
            ringattn.NcclComm(bytes(128), 0, 1, 0)
        return
    with pytest.raises(ValueError, match="unique_id has 3 bytes, expected 128"):
        ringattn.NcclComm(b"abc", 0, 1, 0)
    with pytest.raises(ValueError, match="rank 2 of size 2: expected 0 <= rank < size"):
        ringattn.NcclComm(bytes(128), 2, 2, 0)


def test_the_device_cache_can_be_emptied_and_bounded_with_or_without_a_gpu():
    # ringattn's cache of device temporaries: emptying or bounding it is always allowed (nothing to do
    # without CUDA or before any GPU call), and an emptied cache holds nothing.
    ringattn.empty_cuda_cache()
    assert ringattn.cuda_cache_bytes() == 0
    ringattn.set_cuda_cache_limit(1 << 30)
    ringattn.set_cuda_cache_limit(2**64 - 1)  # no bound again


def test_a_forced_flash_kernel_is_refused_where_no_cuda_flash_kernel_runs():
    # flash_kernel chooses the CUDA flash_attn2 kernels; on host arrays (or any other implementation) a forced
    # one is an error naming it, never ignored; an unknown name is refused with the known ones.
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 8, 2, 16)).astype(np.float32) for _ in range(3))
    np.testing.assert_array_equal(ringattn.attention(q, k, v, flash_kernel="auto"), ringattn.attention(q, k, v))
    with pytest.raises(ValueError, match="flash_kernel wgmma chooses the kernels of flash_attn2 on cuda.*'flash_attn2' on cpu"):
        ringattn.attention(q, k, v, flash_kernel="wgmma")
    with pytest.raises(ValueError, match="'sdpa' on cpu runs none of them"):
        ringattn.attention(q, k, v, impl="sdpa", flash_kernel="mma_sync")
    with pytest.raises(ValueError, match="flash_kernel 'tma': expected auto, mma_sync or wgmma"):
        ringattn.attention(q, k, v, flash_kernel="tma")


def test_deterministic_is_an_option_of_every_call():
    # Host backwards sum in a fixed order anyway: deterministic=True gives the same bits as without it.
    q, k, v, do, extra = problem(9, causal=True)
    o, lse = ringattn.attention(q, k, v, return_lse=True, deterministic=True, **extra)
    plain = ringattn.attention_backward(q, k, v, o, lse, do, **extra)
    fixed = ringattn.attention_backward(q, k, v, o, lse, do, deterministic=True, **extra)
    for a, b in zip(plain, fixed):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="option deterministic is 'yes' of type str: expected a bool"):
        ringattn.attention_backward(q, k, v, o, lse, do, deterministic="yes")


@pytest.mark.parametrize("impl", ["sdpa", "flash_attn2", "blockwise"])
def test_host_backward_repeats_a_broadcast_bias_gradients_bits_with_deterministic(impl):
    # A broadcast bias's gradient is shared across batch, heads, rows or keys; the host kernels give each shared
    # element to one thread, its sharers in order, so deterministic=True takes every bias and repeats its bits
    # (tests/attention/backward_test.cc runs the same with 4 threads).
    q, k, v, do, _ = problem(19, T=29, S=41)
    full = np.random.default_rng(20).standard_normal((2, 4, 29, 41)).astype(np.float32)
    for bias in [full[:1, :1], full[:, :1], full[:, :, :1], full[..., :1], full]:
        opts = dict(causal=True, bias=bias, impl=impl, deterministic=True)
        o, lse = ringattn.attention(q, k, v, return_lse=True, **opts)
        first = ringattn.attention_backward(q, k, v, o, lse, do, **opts)
        assert first[3].shape == bias.shape
        for _ in range(3):
            for mine, theirs in zip(ringattn.attention_backward(q, k, v, o, lse, do, **opts), first):
                np.testing.assert_array_equal(mine, theirs)


def test_option_values_of_numpy_types_and_their_refusals():
    # A config read through numpy gives numpy scalars: its bools and ints are taken as Python's. A value of
    # the wrong kind is refused naming the option, the value and what it takes.
    q, k, v, _, _ = problem(10, T=20, S=20)
    want = ringattn.attention(q, k, v, causal=True, window=(3, 0), dropout=0.25, dropout_seed=7)
    got = ringattn.attention(q, k, v, causal=np.bool_(True), window=(np.int64(3), np.int32(0)),
                             dropout=np.float32(0.25), dropout_seed=np.uint64(7))
    np.testing.assert_array_equal(got, want)
    for options, pattern in [
        (dict(causal=1), "option causal is 1 of type int: expected a bool"),
        (dict(dropout=0.1, dropout_seed=-1), r"option dropout_seed is -1 of type int: expected an integer in \[0, 2\^64\)"),
        (dict(batch_offset=1.5), "option batch_offset is 1.5 of type float: expected an integer"),
        (dict(dropout_seed=3), "dropout_seed 3 without dropout: no pair is dropped"),
        (dict(causal=np.ones(100, bool)), r"option causal is array\(\[ True, .*\.\.\. of type ndarray: expected a bool"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            ringattn.attention(q, k, v, **options)
    for name in ["segment_ids", "bias"]:
        with pytest.raises(ValueError, match=f"{name} has dtype bool, which only the mask may have"):
            ringattn.attention(q, k, v, **{name: np.ones((2, 20) if name == "segment_ids" else (20, 20), bool)})
    with pytest.raises(ValueError, match="q has dtype bool, which only the mask may have"):
        ringattn.attention(q > 0, k, v)
    # The functions' own keywords likewise (a string "false" would have read as true).
    assert ringattn.attention(q, k, v, return_lse=np.bool_(True))[1].shape == (2, 4, 20)
    for call, pattern in [
        (lambda: ringattn.attention(q, k, v, return_lse=1), "return_lse is 1 of type int: expected a bool"),
        (lambda: ringattn.attention(q, k, v, impl=None), "impl is None of type NoneType: expected a str"),
        (lambda: ringattn.attention_backward(q, k, v, q, np.zeros((2, 4, 20), np.float32), q, f32_gradients="false"),
         "f32_gradients is 'false' of type str: expected a bool"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            call()


def test_kept_implementations_released_and_made_again():
    # The package releases them at interpreter exit (atexit), while CUDA is up; a call after a release makes
    # them again.
    q, k, v, do, _ = problem(11, T=9, S=9)
    o, lse = ringattn.attention(q, k, v, return_lse=True)
    ringattn._core.release_impls()
    again, _ = ringattn.attention(q, k, v, return_lse=True)
    np.testing.assert_array_equal(o, again)
    ringattn.attention_backward(q, k, v, o, lse, do)
