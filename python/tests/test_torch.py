"""ringattn.torch (PyTorch custom ops with autograd) on CPU tensors: forward and backward equal
F.scaled_dot_product_attention computed in f64 (math backend), and the f64 numpy reference for the options
SDPA cannot express; gradcheck; torch.library.opcheck of the ops' registrations; torch.compile of a module
that calls it. Under mpirun (CTest python_torch_ring_N_ranks) ring_attention's shard of o and of the
gradients equals the same rows of one process's attention. Skipped where PyTorch is not installed."""

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs none; run on a machine with it)")
F = torch.nn.functional

import ringattn  # noqa: E402
import ringattn.torch as rt  # noqa: E402
import reference  # noqa: E402

TOL = 2e-5  # f32 kernels against an f64 reference, relative to the largest entry


def close(got, want, tol=TOL):
    got, want = got.detach().double(), want.detach().double()
    scale = max(1.0, float(want.abs().max()))
    err = float((got - want).abs().max()) / scale
    assert err <= tol, f"max error {err:.3g} > {tol:.3g}"


def relative_error(got, want):
    """The largest difference relative to want's largest entry (for tensors far from unit scale)."""
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).abs().max() / want.abs().max())


def tensors(seed, B=2, T=37, S=37, H=4, Hkv=2, D=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(B, S, Hkv, D, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(B, S, Hkv, D, generator=g, dtype=dtype, requires_grad=True)
    do = torch.randn(B, T, H, D, generator=g, dtype=dtype)
    return q, k, v, do


def sdpa_f64(q, k, v, **kw):
    """PyTorch's math SDPA in f64 on (B, T, H, D) leaves, GQA by repeating K/V heads."""
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(rep, dim=2) for x in (k, v))
    o = F.scaled_dot_product_attention(q.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), **kw).transpose(1, 2)
    return o, (q, k, v)


@pytest.mark.parametrize("impl", ["flash_attn2", "sdpa", "blockwise"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_equal_sdpa_in_f64(impl, causal):
    q, k, v, do = tensors(1)
    o = rt.attention(q, k, v, causal=causal, impl=impl)
    o.backward(do)
    want, leaves = sdpa_f64(q, k, v, is_causal=causal)
    want.backward(do.double())
    close(o, want)
    for got, ref in zip((q.grad, k.grad, v.grad), leaves):
        close(got, ref.grad)


@pytest.mark.parametrize("bias_dims", [4, 3])
def test_bhtd_layout_and_a_float_bias_with_its_gradient_equal_sdpa(bias_dims):
    # 3 dims: (H, T, S), leading 1s dropped as SDPA broadcasts attn_mask; the gradient comes back in that shape
    g = torch.Generator().manual_seed(2)
    B, H, T, S, D = 2, 4, 29, 41, 16
    q = torch.randn(B, H, T, D, generator=g, requires_grad=True)
    k = torch.randn(B, H, S, D, generator=g, requires_grad=True)
    v = torch.randn(B, H, S, D, generator=g, requires_grad=True)
    bias = torch.randn(*(1, H, T, S)[4 - bias_dims:], generator=g, requires_grad=True)
    do = torch.randn(B, H, T, D, generator=g)
    o = rt.attention(q, k, v, bias=bias, layout_bhtd=True)
    o.backward(do)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v, bias)]
    want = F.scaled_dot_product_attention(*leaves[:3], attn_mask=leaves[3])
    want.backward(do.double())
    close(o, want)
    assert bias.grad.shape == bias.shape
    for got, ref in zip((q.grad, k.grad, v.grad, bias.grad), leaves):
        close(got, ref.grad)


@pytest.mark.parametrize("impl, compiled", [("flash_attn2", False), ("sdpa", False), ("blockwise", False),
                                            ("flash_attn2", True)])
def test_a_bias_or_sinks_without_requires_grad_get_no_gradient_and_the_rest_is_unchanged(impl, compiled):
    # An attention mask given as a float bias (Hugging Face's) takes no gradient: the backward forms none (its
    # sums skipped) and q, k, v get the same bits as beside a bias whose gradient is formed.
    g = torch.Generator().manual_seed(33)
    bias0, sinks0 = torch.randn(2, 4, 29, 41, generator=g), torch.randn(4, generator=g)

    def step(q, k, v, bias, sinks):
        return rt.attention(q, k, v, causal=True, bias=bias, sinks=sinks, impl=impl)

    run = torch.compile(step, fullgraph=True) if compiled else step
    grads = {}
    for bias_grad, sinks_grad in [(True, True), (False, True), (True, False), (False, False)]:
        q, k, v, do = tensors(34, T=29, S=41, H=4, Hkv=2)
        bias, sinks = bias0.clone().requires_grad_(bias_grad), sinks0.clone().requires_grad_(sinks_grad)
        run(q, k, v, bias, sinks).backward(do)
        assert (bias.grad is not None, sinks.grad is not None) == (bias_grad, sinks_grad)
        grads[bias_grad, sinks_grad] = [x.grad for x in (q, k, v, bias, sinks)]
    for key, got in grads.items():
        for mine, theirs in zip(got, grads[True, True]):
            if mine is not None:
                assert torch.equal(mine, theirs), key
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v, bias0, sinks0)]
    want, _ = attention_by_autograd_f64(*leaves[:3], causal=True, bias=leaves[3], sinks=leaves[4])
    want.backward(do.double())
    for got, ref in zip(grads[True, True], leaves):
        close(got, ref.grad)


@pytest.mark.parametrize("qkv_format, axes", [("bhsd", (0, 2, 1, 3)), ("sbhd", (1, 0, 2, 3))])
def test_qkv_format_gives_bshd_results_and_gradients(qkv_format, axes):
    q, k, v, do = tensors(14, T=29, S=23)
    o = rt.attention(q, k, v, causal=True)
    o.backward(do)
    leaves = [x.detach().permute(axes).contiguous().requires_grad_() for x in (q, k, v)]
    o_f = rt.attention(*leaves, causal=True, qkv_format=qkv_format)
    assert torch.equal(o_f, o.detach().permute(axes))
    o_f.backward(do.permute(axes))
    for got, want in zip(leaves, (q, k, v)):
        assert torch.equal(got.grad, want.grad.permute(axes))
    with pytest.raises(ValueError, match="v is a list, expected an array"):
        rt.attention(q, k, v.tolist(), qkv_format=qkv_format)
    if qkv_format == "bhsd":  # layout_bhtd=True, its older name, is the same
        assert torch.equal(rt.attention(*leaves, causal=True, layout_bhtd=True), o_f)
        with pytest.raises(ValueError, match="layout_bhtd=True is qkv_format='bhsd', which qkv_format='sbhd'"):
            rt.attention(*leaves, layout_bhtd=True, qkv_format="sbhd")


def test_masks_are_named_by_tensor_and_version():
    """The name the core gets for a mask's bytes (its tile summary made once a name, on GPUs): the same while the
    tensor is unchanged, whatever view of it is passed; new after any in-place write PyTorch counts; never for an
    inference tensor, whose writes are not counted."""
    mask = torch.rand(2, 1, 9, 9) < 0.5
    name = rt._mask_identity(mask)
    assert name != 0 and rt._mask_identity(mask) == name
    assert rt._mask_identity(mask[:, :, :5]) == name  # a view: the root's bytes (the core keys its address too)
    mask[0, 0, 3].fill_(True)
    renamed = rt._mask_identity(mask)
    assert renamed not in (0, name) and rt._mask_identity(mask[1]) == renamed
    mask.logical_not_()
    assert rt._mask_identity(mask) not in (0, name, renamed)
    assert rt._mask_identity(mask.clone()) != rt._mask_identity(mask)
    with torch.inference_mode():
        assert rt._mask_identity(torch.ones(3, 3, dtype=torch.bool)) == 0


@pytest.mark.parametrize("imports", ["import ringattn; import torch", "import ringattn.torch"])
def test_ringattn_imported_before_torch(imports):
    # A fresh interpreter importing ringattn first: its core's NVIDIA libraries are the ones PyTorch loads (the CUDA
    # toolkit's older NCCL, loaded first, had left `import torch` failing on an undefined NCCL symbol).
    done = subprocess.run([sys.executable, "-c", imports + "; import torch; print(torch.zeros(2).sum().item())"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "0.0", done.stderr[-2000:]


def test_a_two_dimensional_boolean_mask_as_sdpa_takes_it():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, n, 16, generator=g, dtype=torch.float64) for n in (23, 31, 31))
    mask = torch.rand(23, 31, generator=g) < 0.8
    mask[:, 0] = True  # no fully masked row: SDPA gives those NaN, we give 0
    got = rt.attention(q.float(), k.float(), v.float(), mask=mask, layout_bhtd=True)
    close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("q_shape, kv_shape", [((0, 5, 2, 8), (0, 5, 2, 8)), ((2, 0, 2, 8), (2, 5, 2, 8)),
                                               ((2, 5, 2, 8), (2, 0, 2, 8))])
def test_empty_tensors_give_empty_results_and_gradients(q_shape, kv_shape):
    # PyTorch's empty tensors have no memory (a null pointer, strides counting 0 as 1): neither "not given"
    # nor "not contiguous". No key at all: zeros, as a fully masked row.
    q = torch.randn(*q_shape, requires_grad=True)
    k, v = (torch.randn(*kv_shape, requires_grad=True) for _ in range(2))
    o = rt.attention(q, k, v, causal=True)
    assert o.shape == q.shape and (o == 0).all()
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape

def test_every_option_with_sinks_gradient_equals_the_f64_reference():
    q, k, v, do = tensors(3, T=31, S=45)
    g = torch.Generator().manual_seed(4)
    sinks = torch.randn(4, generator=g, requires_grad=True)
    mask = torch.rand(2, 1, 31, 45, generator=g) < 0.8
    options = dict(causal=True, window=(20, 5), softcap=5.0, scale=0.3)
    o, lse = rt.attention(q, k, v, sinks=sinks, mask=mask, return_lse=True, **options)
    assert lse.requires_grad  # differentiable; unused here, so no dLSE reaches the backward
    o.backward(do)
    n = lambda x: x.detach().numpy().astype(np.float64)  # noqa: E731
    ref_o, ref_lse, _ = reference.forward(n(q), n(k), n(v), sinks=n(sinks), mask=mask.numpy(), **options)
    dq, dk, dv, _, dsinks = reference.backward(n(q), n(k), n(v), n(do), sinks=n(sinks), mask=mask.numpy(), **options)
    close(o, torch.from_numpy(ref_o))
    close(lse, torch.from_numpy(ref_lse))
    for got, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv), (sinks.grad, dsinks)):
        close(got, torch.from_numpy(want))


GRADCHECK_OPTIONS = {
    "plain": {},
    "causal_gqa": {"causal": True},
    "window_softcap_scale": {"window": (3, 1), "softcap": 2.0, "scale": 0.5},
    "sinks_bias": {"causal": True, "sinks": True, "bias": True},
    "shared_bias_mask": {"bias": "shared", "mask": True},
    "segments": {"segments": True},
    "dropout": {"dropout": 0.3, "dropout_seed": 17},
    "everything": {"causal": True, "window": (6, 0), "softcap": 3.0, "sinks": True, "bias": True, "mask": True,
                   "segments": True, "dropout": 0.2, "dropout_seed": 5},
}


@pytest.mark.parametrize("name", list(GRADCHECK_OPTIONS))
def test_gradcheck_in_f64(name):
    # float64 tensors run the f64 reference (impl="sdpa" on CPU) through the same custom ops and autograd
    # formula as every implementation: gradcheck's finite differences against its backward, every option,
    # with gradients for bias and sinks. S != T, GQA, a row the mask and segments may leave empty.
    B, T, S, H, Hkv, D, Dv = 2, 5, 7, 4, 2, 3, 2
    g = torch.Generator().manual_seed(len(name))
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    opts = dict(GRADCHECK_OPTIONS[name])
    q, k, v = r(B, T, H, D), r(B, S, Hkv, D), r(B, S, Hkv, Dv)
    inputs = [q.requires_grad_(), k.requires_grad_(), v.requires_grad_()]
    extra = {}
    if opts.pop("sinks", False):
        inputs.append(r(H).requires_grad_())
    bias = opts.pop("bias", False)
    if bias:
        inputs.append((r(1, H, 1, S) if bias == "shared" else r(B, H, T, S)).requires_grad_())
    if opts.pop("mask", False):
        extra["mask"] = torch.rand(B, 1, T, S, generator=g) < 0.7
    if opts.pop("segments", False):
        extra["segment_ids"] = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 2]], dtype=torch.int32)
        extra["kv_segment_ids"] = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 2, 2]], dtype=torch.int32)
    with_sinks = "sinks" in GRADCHECK_OPTIONS[name]

    def fn(q, k, v, *rest):
        rest = list(rest)
        sinks = rest.pop(0) if with_sinks else None
        bias = rest.pop(0) if rest else None
        return rt.attention(q, k, v, impl="sdpa", sinks=sinks, bias=bias, **extra, **opts)

    assert fn(*inputs).dtype == torch.float64
    assert torch.autograd.gradcheck(fn, tuple(inputs))


@pytest.mark.parametrize("name", list(GRADCHECK_OPTIONS))
def test_gradcheck_in_f64_of_o_and_lse(name):
    # lse is an output too: gradcheck differentiates both (a row nothing is visible to has lse -inf, whose
    # finite differences are NaN: such rows are set to 0, their gradient 0).
    B, T, S, H, Hkv, D, Dv = 2, 5, 7, 4, 2, 3, 2
    g = torch.Generator().manual_seed(100 + len(name))
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    opts = dict(GRADCHECK_OPTIONS[name])
    inputs = [r(B, T, H, D).requires_grad_(), r(B, S, Hkv, D).requires_grad_(), r(B, S, Hkv, Dv).requires_grad_()]
    extra = {}
    if opts.pop("sinks", False):
        extra["sinks"] = r(H)
    bias = opts.pop("bias", False)
    if bias:
        extra["bias"] = r(1, H, 1, S) if bias == "shared" else r(B, H, T, S)
    if opts.pop("mask", False):
        extra["mask"] = torch.rand(B, 1, T, S, generator=g) < 0.7
    if opts.pop("segments", False):
        extra["segment_ids"] = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 2]], dtype=torch.int32)
        extra["kv_segment_ids"] = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 2, 2]], dtype=torch.int32)

    def fn(q, k, v):
        o, lse = rt.attention(q, k, v, impl="sdpa", return_lse=True, **extra, **opts)
        return o, torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))

    assert torch.autograd.gradcheck(fn, tuple(inputs))


def attention_by_autograd_f64(q, k, v, causal=False, softcap=0.0, sinks=None, bias=None):
    """o and lse of (B, T, H, D) tensors written out in f64 torch ops, differentiated by autograd: a formulation
    that shares nothing with ringattn's backward (no delta, no recomputed P)."""
    q, k, v = (x.double() for x in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(rep, dim=2) for x in (k, v))
    s = torch.einsum("bthd,bshd->bhts", q, kk) / q.shape[-1] ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.double()
    if causal:
        T, S = s.shape[-2:]
        hidden = torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)
        s = s.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        sink_column = sinks.double()[None, :, None, None].expand(*s.shape[:3], 1)
        lse = torch.logsumexp(torch.cat([s, sink_column], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("bhts,bshd->bthd", torch.exp(s - lse[..., None]), vv)
    return o, lse


@pytest.mark.parametrize("impl", ["flash_attn2", "sdpa", "blockwise"])
@pytest.mark.parametrize("options", ["plain", "causal_sinks_softcap_bias"])
def test_a_loss_reading_lse_gets_its_gradient_as_autograd_in_f64(impl, options):
    q, k, v, do = tensors(21, T=29, S=41, H=4, Hkv=1)
    g = torch.Generator().manual_seed(22)
    dlse = torch.randn(2, 4, 29, generator=g)
    kw = {}
    if options != "plain":
        kw = dict(causal=True, softcap=4.0, sinks=torch.randn(4, generator=g).requires_grad_(),
                  bias=torch.randn(2, 4, 29, 41, generator=g).requires_grad_())
    o, lse = rt.attention(q, k, v, impl=impl, return_lse=True, **kw)
    ((o * do).sum() + (lse * dlse).sum()).backward()
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref_kw = {name: x.detach().double().requires_grad_() for name, x in kw.items() if torch.is_tensor(x)}
    want_o, want_lse = attention_by_autograd_f64(*leaves, causal=kw.get("causal", False), softcap=kw.get("softcap", 0.0),
                                                 **ref_kw)
    ((want_o * do.double()).sum() + (want_lse * dlse.double()).sum()).backward()
    close(lse, want_lse)
    for got, want in zip((q.grad, k.grad, v.grad), leaves):
        close(got, want.grad)
    for name, x in ref_kw.items():
        close(kw[name].grad, x.grad)


@pytest.mark.parametrize("impl", ["flash_attn2", "sdpa"])
def test_two_calls_merged_by_their_lse_have_the_gradients_of_one_call(impl):
    # What a user's own ring or a KV cache split does: attention over two halves of the keys, merged by lse.
    q, k, v, do = tensors(23, T=33, S=50)
    o1, lse1 = rt.attention(q, k[:, :20], v[:, :20], impl=impl, return_lse=True)
    o2, lse2 = rt.attention(q, k[:, 20:], v[:, 20:], impl=impl, return_lse=True)
    lse = torch.logaddexp(lse1, lse2)
    weight = lambda part: torch.exp(part - lse).transpose(1, 2)[..., None]  # noqa: E731  (B, T, H, 1)
    merged = o1 * weight(lse1) + o2 * weight(lse2)
    merged.backward(do)
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    whole = rt.attention(q, k, v, impl=impl)
    whole.backward(do)
    close(merged, whole)
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        close(got, want)


def test_a_loss_of_lse_alone_has_gradients():
    q, k, v, _ = tensors(24, T=9, S=9)
    _, lse = rt.attention(q, k, v, return_lse=True)
    lse.sum().backward()  # no dO: the backward takes zeros for it
    want_lse = attention_by_autograd_f64(*(x.detach().double().requires_grad_() for x in (q, k, v)))[1]
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    attention_by_autograd_f64(*leaves)[1].sum().backward()
    close(lse, want_lse)
    for got, want in zip((q.grad, k.grad, v.grad), leaves):
        close(got, want.grad if want.grad is not None else torch.zeros_like(want))


def test_autocast_runs_attention_in_its_dtype_as_sdpa_does():
    # f32 activations under torch.autocast: q, k, v cast to autocast's dtype (bf16 here), as
    # F.scaled_dot_product_attention takes them; the gradients come back to the f32 leaves in f32.
    q, k, v, do = tensors(25, T=19, S=23)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = rt.attention(q, k, v, causal=True)
        want = F.scaled_dot_product_attention(q.transpose(1, 2), k.repeat_interleave(2, 2).transpose(1, 2),
                                              v.repeat_interleave(2, 2).transpose(1, 2), is_causal=False,
                                              attn_mask=torch.ones(19, 23, dtype=torch.bool).tril(4)).transpose(1, 2)
    assert o.dtype == torch.bfloat16 and want.dtype == torch.bfloat16
    close(o.float(), want.float(), 2e-2)
    o.float().backward(do)
    assert q.grad.dtype == torch.float32 and k.grad.dtype == torch.float32
    leaves = [x.detach().to(torch.bfloat16).double().requires_grad_() for x in (q, k, v)]
    ref, _ = attention_by_autograd_f64(*leaves, causal=True)
    ref.backward(do.double())
    for got, want in zip((q.grad, k.grad, v.grad), leaves):
        close(got, want.grad, 3e-2)


def test_f64_runs_only_the_reference():
    q, k, v, _ = tensors(8, T=4, S=4, dtype=torch.float64)
    with pytest.raises(ValueError, match="impl 'sdpa' on the host"):
        rt.attention(q, k, v)  # flash_attn2, the default


@pytest.mark.filterwarnings("ignore:Input #")  # f32 inputs on purpose (see below)
def test_gradcheck_in_f32_with_wide_steps():
    # The kernels themselves (flash_attn2 here) take f16 / bf16 / f32: finite differences with a step f32 resolves.
    q, k, v, _ = tensors(5, B=1, T=6, S=7, H=2, Hkv=1, D=4)
    sinks = torch.randn(2, requires_grad=True)
    fn = lambda q, k, v, s: rt.attention(q, k, v, sinks=s, causal=True, softcap=3.0)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, sinks), eps=1e-2, atol=2e-3, rtol=2e-3, nondet_tol=1e-6)


def test_compile_caches_are_tagged_with_this_ringattn_torch():
    # PyTorch's compile caches do not key on a custom op's schema or autograd formula: a backward cached under
    # another ringattn.torch (another op signature) failed here, replayed. The tag every cache key includes
    # names this file's contents.
    import hashlib
    import pathlib
    digest = hashlib.sha256(pathlib.Path(rt.__file__).read_bytes()).hexdigest()[:16]
    assert "ringattn-" + digest in torch.compiler.config.cache_key_tag.split(",")


def test_opcheck_of_the_registrations():
    q, k, v, _ = tensors(6, T=9, S=9)
    args = (q, k, v, None, None, None, None, None, True, -1, -1, 0.0, 0.0, 0.0, 0, 0, 0, "auto", False, "flash_attn2")
    torch.library.opcheck(torch.ops.ringattn.attention_forward.default, args)


@pytest.mark.parametrize("lse_in_loss", [False, True])
def test_torch_compile_of_a_module_calling_it_matches_eager(lse_in_loss):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 3 * 32)

        def forward(self, x):
            q, k, v = self.proj(x).view(x.shape[0], x.shape[1], 3, 4, 8).unbind(2)
            o, lse = rt.attention(q, k, v, causal=True, return_lse=True)
            return o.sum() + (0.1 * (lse ** 2).sum() if lse_in_loss else 0)  # a z-loss on lse

    torch.manual_seed(7)
    check_compiled_matches_eager(Block(), torch.randn(2, 23, 32))


def check_compiled_matches_eager(block, x):
    """block(x) (a scalar) and its parameters' gradients, compiled (aot_eager, one graph) and eager."""
    eager = block(x)
    eager.backward()
    want = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    got = compiled(x)
    got.backward()
    close(got, eager, 1e-6)
    for g, w in zip((p.grad for p in block.parameters()), want):
        close(g, w, 1e-6)


def test_bad_input_raises_value_error_naming_the_tensor():
    q, k, v, _ = tensors(8)
    with pytest.raises(ValueError, match="k"):
        rt.attention(q, k[:, :, :, :16], v)


def test_torch_export_of_a_module_calling_it_runs_as_eager():
    class Attend(torch.nn.Module):
        def forward(self, q, k, v):
            return rt.attention(q, k, v, causal=True, window=(8, 0))

    q, k, v, _ = tensors(9, T=21, S=21)
    args = tuple(x.detach() for x in (q, k, v))
    exported = torch.export.export(Attend(), args)
    assert "ringattn.attention_forward" in str(exported.graph)
    close(exported.module()(*args), Attend()(*args), 0.0)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_shard_and_unshard_keep_torch_tensors(layout):
    x = torch.arange(2 * 23 * 3, dtype=torch.float32).view(2, 23, 3)
    shards = [ringattn.shard(x, 1, layout, rank, 4) for rank in range(4)]
    assert all(isinstance(s, torch.Tensor) for s in shards)
    back = ringattn.unshard(shards, 1, layout)
    assert isinstance(back, torch.Tensor) and torch.equal(back, x)


def test_a_ring_without_a_usable_communicator_says_what_is_missing():
    q, k, v, _ = tensors(10)
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        rt.ring_attention(q, k, v)
    with pytest.raises(ValueError, match="comm is a str, expected an mpi4py communicator"):
        rt.ring_attention(q, k, v, comm="world")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_tensors_give_gradients_in_their_dtype_near_sdpa_in_f64(dtype):
    q, k, v, do = (x.detach().to(dtype) for x in tensors(11))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    o = rt.attention(q, k, v, causal=True)
    o.backward(do)
    want, leaves = sdpa_f64(q, k, v, is_causal=True)
    want.backward(do.double())
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3  # a few units of the dtype's rounding
    assert o.dtype == dtype and q.grad.dtype == dtype
    close(o, want, tol)
    for got, ref in zip((q.grad, k.grad, v.grad), leaves):
        close(got, ref.grad, tol)


def test_dropout_backward_uses_the_forwards_mask():
    # Same seed, same mask: the op's gradients equal the numpy core's backward of the same call.
    q, k, v, do = tensors(12)
    o = rt.attention(q, k, v, dropout=0.2, dropout_seed=7)
    o.backward(do)
    n = lambda x: x.detach().numpy()  # noqa: E731
    o_np, lse_np = ringattn.attention(n(q), n(k), n(v), dropout=0.2, dropout_seed=7, return_lse=True)
    dq, dk, dv = ringattn.attention_backward(n(q), n(k), n(v), o_np, lse_np, n(do), dropout=0.2, dropout_seed=7)
    close(o, torch.from_numpy(o_np), 0.0)
    for got, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
        close(got, torch.from_numpy(want), 0.0)
    no_dropout = rt.attention(q, k, v)
    assert float((o - no_dropout).detach().abs().max()) > 1e-3  # dropout did act


def test_dropout_on_a_slice_of_batch_and_heads_with_its_offsets_drops_what_the_whole_does():
    # A data- or tensor-parallel rank's slice (batches 1.., the second kv group) keys dropout by global indices.
    q, k, v, do = tensors(45, B=3, T=21, S=25)
    options = dict(dropout=0.3, dropout_seed=9, causal=True)
    whole = rt.attention(q, k, v, **options)
    whole.backward(do)
    part = lambda x, heads: x.detach()[1:, :, heads].clone().requires_grad_()  # noqa: E731
    for offsets, same in ((dict(batch_offset=1, head_offset=2), True), ({}, False)):
        qs, ks, vs = part(q, slice(2, 4)), part(k, slice(1, 2)), part(v, slice(1, 2))
        o = rt.attention(qs, ks, vs, **options, **offsets)
        o.backward(do[1:, :, 2:4])
        pairs = ((o, whole[1:, :, 2:4]), (qs.grad, q.grad[1:, :, 2:4]), (ks.grad, k.grad[1:, :, 1:2]),
                 (vs.grad, v.grad[1:, :, 1:2]))
        agree = [torch.allclose(got, want, atol=1e-5) for got, want in pairs]
        assert all(agree) if same else not agree[0], (offsets, agree)


def test_int64_segment_ids_are_taken_as_int32():
    q, k, v = (x.requires_grad_() for x in tensors(43, T=20, S=20)[:3])
    seg = torch.arange(4).repeat_interleave(5).expand(2, 20)  # torch.long, PyTorch's default
    o = rt.attention(q, k, v, segment_ids=seg)
    o.sum().backward()
    close(o, rt.attention(q, k, v, segment_ids=seg.int()), 0.0)


def test_double_backward_is_refused_by_name():
    q, k, v = tensors(44, T=9, S=9)[:3]
    (dq,) = torch.autograd.grad(rt.attention(q, k, v).sum(), q, create_graph=True)  # the first order works
    with pytest.raises(RuntimeError, match="not differentiable itself"):
        torch.autograd.grad(dq.sum(), q)


def test_deterministic_reaches_the_backward_and_changes_no_cpu_bit():
    # CPU backwards sum in a fixed order anyway; on CUDA tensors the flag orders dQ's sums (test_torch_cuda.py).
    grads = []
    for deterministic in (False, True):
        q, k, v, do = tensors(11)
        rt.attention(q, k, v, causal=True, deterministic=deterministic).backward(do)
        grads.append((q.grad, k.grad, v.grad))
    for plain, fixed in zip(*grads):
        assert torch.equal(plain, fixed)


def test_flags_of_another_type_are_refused_by_name():
    # A string such as "no" would read as true: causal and deterministic take bools (Python's or numpy's) only.
    q, k, v, _ = tensors(12)
    for options, pattern in [(dict(causal="no"), "causal is 'no' of type str: expected a bool"),
                             (dict(deterministic="false"), "deterministic is 'false' of type str: expected a bool")]:
        with pytest.raises(ValueError, match=pattern):
            rt.attention(q, k, v, **options)
    assert rt.attention(q, k, v, causal=np.bool_(True)).shape == q.shape


def test_eager_calls_skip_the_ops_dispatch_and_modes_still_see_the_op():
    """Plain eager calls run through a torch.autograd.Function (the custom op's dispatch costs more than a
    small call's kernels); a dispatch mode (as FakeTensorMode, FlopCounterMode) sees the op itself, with
    gradients equal either way, and a double backward is refused by name on both paths."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v, do = tensors(46, T=12, S=12)
    sinks = torch.nn.Parameter(torch.randn(4))  # a parameter, as learned sinks are, stays on the eager path
    o = rt.attention(q, k, v, causal=True, sinks=sinks)
    assert "Eager" in type(o.grad_fn).__name__, type(o.grad_fn)
    eager = torch.autograd.grad(o, (q, k, v, sinks), do)
    with Seen() as seen:
        o_op = rt.attention(q, k, v, causal=True, sinks=sinks)
        through_op = torch.autograd.grad(o_op, (q, k, v, sinks), do)
    assert any("ringattn.attention_forward" in name for name in seen.ops), seen.ops
    assert any("ringattn.attention_backward" in name for name in seen.ops), seen.ops
    close(o_op, o, 0.0)
    for a, b in zip(eager, through_op):
        close(a, b, 0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_sinks_and_a_bias_in_a_models_dtype_are_read_in_f32_and_get_gradients_in_theirs(dtype):
    # SDPA takes attn_mask in q's dtype and gpt-oss holds its sinks in bf16: given so, both are cast to the
    # kernels' f32 differentiably, so their gradients come back in the dtype given, equal to the f32 call's.
    q, k, v, do = tensors(47, T=13, S=17)
    g = torch.Generator().manual_seed(48)
    sinks32, bias32 = torch.randn(4, generator=g), torch.randn(2, 4, 13, 17, generator=g)
    sinks, bias = (x.to(dtype).requires_grad_() for x in (sinks32, bias32))
    o = rt.attention(q, k, v, sinks=sinks, bias=bias)
    d_sinks, d_bias = torch.autograd.grad(o, (sinks, bias), do)
    assert d_sinks.dtype == dtype and d_bias.dtype == dtype
    sinks32, bias32 = (x.to(dtype).float().requires_grad_() for x in (sinks32, bias32))
    o32 = rt.attention(q, k, v, sinks=sinks32, bias=bias32)
    want = torch.autograd.grad(o32, (sinks32, bias32), do)
    close(o, o32, 0.0)
    for got, ref in zip((d_sinks, d_bias), want):
        close(got, ref.to(dtype), 0.0)


def test_meta_tensors_give_the_results_shapes():
    q, k, v = (x.detach().to("meta") for x in tensors(49, T=9, S=11, D=16)[:3])
    o, lse = rt.attention(q, k, v, causal=True, return_lse=True)
    assert o.is_meta and o.shape == (2, 9, 4, 16) and lse.shape == (2, 4, 9) and lse.dtype == torch.float32


def test_torch_func_grad_is_refused_by_name_and_vmap_runs():
    q, k, v = (x.detach() for x in tensors(50, T=9, S=9)[:3])
    with pytest.raises(RuntimeError, match="cannot run under torch.func.grad.*torch.autograd"):
        torch.func.grad(lambda x: rt.attention(x, k, v).sum())(q)
    with pytest.raises(RuntimeError, match="cannot run under torch.func.grad"):
        torch.func.jvp(lambda x: rt.attention(x, k, v), (q,), (q,))
    batched = torch.func.vmap(lambda x: rt.attention(x, k, v))(torch.stack([q, 2 * q]))
    close(batched[1], rt.attention(2 * q, k, v), 0.0)


@pytest.mark.parametrize("impl", ["flash_attn2", "sdpa", "blockwise"])
@pytest.mark.parametrize("qkv_format, axes", [("bhsd", (0, 2, 1, 3)), ("sbhd", (1, 0, 2, 3))])
def test_tensors_in_another_format_are_read_as_they_lie_with_every_option(impl, qkv_format, axes):
    # A bhsd / sbhd tensor reaches the kernels as a strided view, no copy; each option's results and gradients
    # are the bits of the same call on contiguous bshd tensors.
    g = torch.Generator().manual_seed(51)
    B, T, S, H, Hkv, D = 2, 21, 26, 4, 2, 16
    seg_q, seg_k = torch.tensor([0] * 9 + [1] * 12).expand(B, T), torch.tensor([0] * 12 + [1] * 14).expand(B, S)
    option_sets = [dict(causal=True, window=(6, 0), softcap=4.0), dict(dropout=0.25, dropout_seed=5),
                   dict(segment_ids=seg_q, kv_segment_ids=seg_k, mask=torch.rand(T, S, generator=g) > 0.2)]
    if impl != "blockwise":
        option_sets.append(dict(sinks=torch.randn(H, generator=g), bias=torch.randn(1, H, T, S, generator=g)))
    for options in option_sets:
        q, k, v, do = tensors(52, B=B, T=T, S=S, H=H, Hkv=Hkv, D=D)
        o = rt.attention(q, k, v, impl=impl, **options)
        want = (o,) + torch.autograd.grad(o, (q, k, v), do)
        leaves = [x.detach().permute(axes).contiguous().requires_grad_() for x in (q, k, v)]
        core_view = leaves[0].permute(axes)
        assert torch.from_dlpack(rt._as_it_lies(core_view)).data_ptr() == core_view.data_ptr()  # no copy
        o_f = rt.attention(*leaves, impl=impl, qkv_format=qkv_format, **options)
        got = (o_f,) + torch.autograd.grad(o_f, leaves, do.permute(axes).contiguous())
        for a, b in zip(got, want):
            assert torch.equal(a, b.permute(axes)), (impl, sorted(options))


def test_one_element_dimensions_at_any_stride_are_read_as_they_lie():
    # PyTorch keeps a broadcast's stride 0 on a dimension of one element through contiguous(): such tensors (a batch
    # of one, one K/V head) reach the core as they lie, which gives that dimension the contiguous stride; results
    # and gradients are the bits of the same call on contiguous tensors.
    q, k, v, do = tensors(53, B=1, T=19, S=23, H=4, Hkv=1, D=16)
    o = rt.attention(q, k, v, causal=True)
    want = (o,) + torch.autograd.grad(o, (q, k, v), do)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    views = [leaves[0].as_strided(q.shape, (0,) + q.stride()[1:]),
             leaves[1].as_strided(k.shape, (0, k.stride(1), 0, 1)),
             leaves[2].as_strided(v.shape, (0, v.stride(1), 3, 1))]
    for view in views:
        assert torch.from_dlpack(rt._as_it_lies(view)).data_ptr() == view.data_ptr()  # no copy
    o_s = rt.attention(*views, causal=True)
    got = (o_s,) + torch.autograd.grad(o_s, leaves, do)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_impl_auto_runs_flash_attn2_on_the_host_and_the_f64_reference_for_f64():
    q, k, v, do = tensors(53, T=15, S=19)
    o = rt.attention(q, k, v, causal=True, impl="auto")
    assert torch.equal(o, rt.attention(q, k, v, causal=True, impl="flash_attn2"))
    q64, k64, v64 = (x.detach().double() for x in (q, k, v))
    assert torch.equal(rt.attention(q64, k64, v64, causal=True, impl="auto"),
                       rt.attention(q64, k64, v64, causal=True, impl="sdpa"))
    with pytest.raises(ValueError, match="attention implementation 'bogus' is not registered"):
        rt.attention(q, k, v, impl="bogus")
