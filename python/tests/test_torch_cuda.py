"""ringattn from PyTorch on CUDA tensors (one GPU): forward and backward of each CUDA implementation
against the f64 numpy reference (reference.py, independent of the C++ code) for f16 / bf16, causal or
not, GQA, S != T and every option; the work runs on PyTorch's current stream (a non-blocking stream
that is still producing q is waited for); arrays split between host and device are refused naming the
one that is elsewhere; the framework-neutral core takes and returns CUDA tensors without copies; and
torch.compile traces the op on the GPU; ringattn.hf on CUDA: a model the flash kernels cannot take, a
compiled model, and decoding with a static KV cache; a training step captured into a CUDA graph (torch.cuda.graph,
torch.compile's "reduce-overhead") replays on new inputs, and what a graph cannot replay is refused by name.
Skipped without PyTorch, without a GPU, or in a build of ringattn without CUDA."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs none; run on a machine with it)")
import ringattn  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch (run on a GPU machine)", allow_module_level=True)
if not ringattn.built_with_cuda():
    pytest.skip("this build of ringattn has no CUDA back end", allow_module_level=True)

import ringattn.torch as rt  # noqa: E402
import reference  # noqa: E402
from test_torch import check_compiled_matches_eager, close, relative_error  # noqa: E402

GPU = torch.device("cuda", torch.cuda.current_device())
# Half-precision inputs, f32 accumulation: a few units of the dtype's rounding, relative to the largest entry
# (the tensor-core kernels round P and dS to the inputs' dtype for their products).
TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2}


def tensors(seed, dtype, B=2, T=77, S=77, H=8, Hkv=2, D=64):
    g = torch.Generator().manual_seed(seed)
    made = [torch.randn(B, n, h, D, generator=g) for n, h in ((T, H), (S, Hkv), (S, Hkv), (T, H))]
    q, k, v, do = (x.to(GPU, dtype) for x in made)
    return [x.requires_grad_() for x in (q, k, v)] + [do]


def host64(x):
    return x.detach().double().cpu().numpy()


def check_against_reference(dtype, q, k, v, do, o, lse=None, extra=(), dlse=None, **options):
    """o (and lse) and the leaves' gradients (q, k, v, then `extra` as (leaf, reference name)) against
    the f64 reference of the same inputs as rounded to `dtype` (of a loss reading lse too, with dlse)."""
    arrays = {name: host64(x) if torch.is_tensor(x) and x.is_floating_point() else
              (x.cpu().numpy() if torch.is_tensor(x) else x) for name, x in options.items()}
    ref_o, ref_lse, _ = reference.forward(host64(q), host64(k), host64(v), **arrays)
    dq, dk, dv, dbias, dsinks = reference.backward(host64(q), host64(k), host64(v), host64(do), **arrays,
                                                   dlse=None if dlse is None else host64(dlse))
    tol = TOL[dtype]
    assert o.dtype == dtype and o.device == GPU
    close(o.cpu(), torch.from_numpy(ref_o), tol)
    if lse is not None:
        finite = np.isfinite(ref_lse)
        assert np.array_equal(np.isfinite(lse.detach().cpu().numpy()), finite)
        close(lse.cpu()[finite], torch.from_numpy(ref_lse[finite]), 1e-2)
    wants = {"dbias": dbias, "dsinks": dsinks}
    for leaf, want in [(q, dq), (k, dk), (v, dv)] + [(leaf, wants[name]) for leaf, name in extra]:
        assert leaf.grad.device == GPU
        close(leaf.grad.cpu(), torch.from_numpy(want), tol)


@pytest.mark.parametrize("impl", ["flash_attn2", "sdpa", "cudnn"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_equal_the_f64_reference(impl, dtype, causal):
    # cudnn's fused kernels take whole tiles of keys here; the others odd lengths and S != T.
    shape = dict(T=128, S=128) if impl == "cudnn" else dict(T=45, S=77)
    q, k, v, do = tensors(1, dtype, **shape)
    o, lse = rt.attention(q, k, v, causal=causal, impl=impl, return_lse=True)
    o.backward(do)
    check_against_reference(dtype, q, k, v, do, o, lse, causal=causal)


@pytest.mark.parametrize("impl", ["flash_attn2", "sdpa"])
def test_every_option_and_its_gradients_equal_the_f64_reference(impl):
    dtype = torch.float16
    q, k, v, do = tensors(2, dtype, T=31, S=45)
    g = torch.Generator().manual_seed(3)
    sinks = torch.randn(8, generator=g).to(GPU).requires_grad_()
    bias = torch.randn(2, 1, 31, 45, generator=g).to(GPU).requires_grad_()
    mask = (torch.rand(2, 1, 31, 45, generator=g) < 0.8).to(GPU)
    segments = torch.randint(0, 2, (2, 45), generator=g).sort(dim=1).values.int()
    options = dict(causal=True, window=(20, 5), softcap=5.0, scale=0.3, mask=mask,
                   segment_ids=segments[:, 14:].contiguous().to(GPU), kv_segment_ids=segments.to(GPU))
    o, lse = rt.attention(q, k, v, sinks=sinks, bias=bias, impl=impl, return_lse=True, **options)
    o.backward(do)
    check_against_reference(dtype, q, k, v, do, o, lse, extra=[(bias, "dbias"), (sinks, "dsinks")], sinks=sinks,
                            bias=bias, **options)


def test_a_mask_written_in_place_between_calls_gives_the_new_masks_results():
    # The kernels summarise a mask once per tensor and version (ringattn.torch's mask_identity): the layers of a
    # model share the summary; an in-place write (through the tensor or a view of it) makes a new one.
    dtype = torch.bfloat16
    ids = torch.arange(300) // 70  # documents of 70 keys: tiles hidden whole and kept whole
    mask = (ids[:, None] == ids[None, :])[None, None].to(GPU)
    cases = [("documents", lambda m: None), ("again, unchanged", lambda m: None),
             ("a view written", lambda m: m[0, 0, :, 140:].fill_(True)),
             ("written in place", lambda m: m.logical_not_())]
    for seed, (name, write) in enumerate(cases):
        write(mask)
        q, k, v, do = tensors(10 + seed, dtype, B=1, T=300, S=300, H=4, Hkv=2)
        o = rt.attention(q, k, v, mask=mask)
        o.backward(do)
        try:
            check_against_reference(dtype, q, k, v, do, o, mask=mask)
        except AssertionError as e:
            raise AssertionError(name) from e


def test_a_mask_made_under_inference_mode_is_read_in_every_call():
    # An inference tensor counts no writes: its summary is made in each call, so a write between calls is seen.
    q, k, v, _ = tensors(20, torch.bfloat16, B=1, T=300, S=300, H=4, Hkv=2)
    with torch.inference_mode():
        ids = torch.arange(300, device=GPU) // 70
        mask = (ids[:, None] == ids[None, :])[None, None]
        for write in (lambda m: None, lambda m: m.logical_not_()):
            write(mask)
            o = rt.attention(q, k, v, mask=mask)
            want, _, _ = reference.forward(host64(q), host64(k), host64(v), mask=mask.cpu().numpy())
            close(o.cpu(), torch.from_numpy(want), TOL[torch.bfloat16])


@pytest.mark.parametrize("impl", ["flash_attn2", "sdpa", "cudnn"])
def test_a_loss_reading_lse_gets_its_gradient(impl):
    # cudnn's backward takes no dlse: such a backward runs on flash_attn2's kernels.
    dtype = torch.bfloat16
    q, k, v, do = tensors(4, dtype, T=128, S=128)
    dlse = torch.randn(2, 8, 128, generator=torch.Generator().manual_seed(5)).to(GPU)
    g = torch.Generator().manual_seed(6)
    sinks = torch.randn(8, generator=g).to(GPU).requires_grad_()
    o, lse = rt.attention(q, k, v, causal=True, impl=impl, return_lse=True, sinks=None if impl == "cudnn" else sinks)
    ((o.float() * do.float()).sum() + (lse * dlse).sum()).backward()
    extra = {} if impl == "cudnn" else {"sinks": sinks}
    check_against_reference(dtype, q, k, v, do, o, lse, extra=[(sinks, "dsinks")] if extra else (), dlse=dlse,
                            causal=True, **extra)


@pytest.mark.parametrize("impl", ["flash_attn2", "cudnn"])
def test_f32_activations_under_autocast_run_the_half_precision_kernels(impl):
    # As F.scaled_dot_product_attention under torch.autocast: q, k, v cast to bf16, gradients back in f32.
    q, k, v, do = tensors(7, torch.float32, T=128, S=128)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        o = rt.attention(q, k, v, causal=True, impl=impl)
    assert o.dtype == torch.bfloat16
    o.float().backward(do)
    assert q.grad.dtype == torch.float32
    seen = [host64(x.to(torch.bfloat16)) for x in (q, k, v, do)]  # the values the kernels saw
    ref_o, _, _ = reference.forward(*seen[:3], causal=True)
    close(o.cpu(), torch.from_numpy(ref_o), TOL[torch.bfloat16])
    for got, want in zip((q.grad, k.grad, v.grad), reference.backward(*seen, causal=True)):
        close(got.cpu(), torch.from_numpy(want), TOL[torch.bfloat16])


def test_work_runs_on_pytorchs_current_stream():
    # On a non-blocking stream, q is still being written (behind a 50 ms spin) when the call is queued:
    # only work ordered on that stream sees the finished q.
    dtype = torch.bfloat16
    q, k, v, do = tensors(4, dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        late_q = torch.zeros_like(q)
        torch.cuda._sleep(100_000_000)
        late_q.copy_(q.detach())
        late_q.requires_grad_()
        o = rt.attention(late_q, k, v, causal=True)
        o.backward(do)
    stream.synchronize()
    late_q.grad, q.grad = None, late_q.grad
    check_against_reference(dtype, q, k, v, do, o, causal=True)


def test_arrays_in_two_places_are_refused_naming_the_one_elsewhere():
    q, k, v, _ = tensors(5, torch.float16)
    with pytest.raises(ValueError, match=f"k is in host memory but q is in CUDA device {GPU.index}"):
        rt.attention(q, k.cpu(), v)
    with pytest.raises(ValueError, match="sinks is in host memory but q is in CUDA device"):
        rt.attention(q, k, v, sinks=torch.zeros(8))
    with pytest.raises(ValueError, match="v is in CUDA device [0-9]+ but q is in host memory"):
        rt.attention(q.detach().cpu(), k.detach().cpu(), v)


@pytest.mark.parametrize("impl", ["flash_attn2", "cudnn", "sdpa"])
def test_cuda_outputs_that_share_memory_with_inputs_are_refused_and_nothing_is_written(impl):
    q, k, v, do = (x.detach() for x in tensors(7, torch.bfloat16, T=64, S=64, H=4, Hkv=4))
    o, lse = ringattn.attention(q, k, v, causal=True, return_lse=True, impl=impl)
    mine = q.clone()
    with pytest.raises(ValueError, match="output o shares memory with input q"):
        ringattn.attention(mine, k, v, causal=True, return_lse=True, impl=impl, out=(mine, torch.empty_like(lse)))
    assert torch.equal(mine, q)
    kv = torch.stack([k, v])  # dk written over k and v's buffer
    with pytest.raises(ValueError, match="output dk shares memory with input k"):
        ringattn.attention_backward(q, kv[0], kv[1], o, lse, do, causal=True, impl=impl,
                                    out=(torch.empty_like(q), kv[0], torch.empty_like(v)))
    torch.cuda.synchronize()
    assert torch.equal(kv[0], k) and torch.equal(kv[1], v)


def test_the_core_takes_and_returns_cuda_tensors_of_the_callers_framework():
    q, k, v, do = (x.detach() for x in tensors(6, torch.bfloat16))
    o, lse = ringattn.attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(o, torch.Tensor) and o.device == GPU and lse.device == GPU and lse.dtype == torch.float32
    dq, dk, dv = ringattn.attention_backward(q, k, v, o, lse, do, causal=True)
    assert all(x.device == GPU for x in (dq, dk, dv)) and dq.dtype == torch.bfloat16
    # The custom op gives the same bits: one kernel, one stream.
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o_op = rt.attention(*leaves, causal=True)
    o_op.backward(do)
    assert torch.equal(o_op, o)
    for got, want in zip((leaf.grad for leaf in leaves), (dq, dk, dv)):
        assert torch.equal(got, want)


class ProjectedAttention(torch.nn.Module):
    """q, k, v projected from x (2 heads of 64), causal attention, a scalar loss of its output (`loss`)."""

    def __init__(self, loss):
        super().__init__()
        self.proj = torch.nn.Linear(128, 3 * 128)
        self.loss = loss

    def forward(self, x):
        q, k, v = self.proj(x).view(x.shape[0], x.shape[1], 3, 2, 64).unbind(2)
        return self.loss(rt.attention(q, k, v, causal=True).float())


def test_torch_compile_of_a_module_on_the_gpu_matches_eager():
    torch.manual_seed(7)
    check_compiled_matches_eager(ProjectedAttention(torch.sum).to(GPU, torch.bfloat16),
                                 torch.randn(2, 67, 128, device=GPU, dtype=torch.bfloat16))


EVERY_CUDA_KERNEL = [("flash_attn2", "mma_sync"), ("flash_attn2", "wgmma"), ("cudnn", "auto"), ("sdpa", "auto")]


def attention_unless_no_hopper(*args, flash_kernel, **options):
    """rt.attention, the test skipped where it asks for the wgmma kernels without sm_90a code or a Hopper GPU."""
    try:
        return rt.attention(*args, flash_kernel=flash_kernel, **options)
    except ValueError as e:
        if flash_kernel == "wgmma" and "not a Hopper" in str(e):
            pytest.skip(str(e))
        raise


@pytest.mark.parametrize("flash_kernel", ["mma_sync", "wgmma"])
def test_each_flash_kernel_chosen_per_call_equals_the_f64_reference(flash_kernel):
    # flash_kernel picks the CUDA flash_attn2 kernels for one call (forward and backward); wgmma needs an
    # sm_90a build on a Hopper GPU, and says so otherwise.
    q, k, v, do = tensors(5, torch.bfloat16, T=45, S=77)
    o, lse = attention_unless_no_hopper(q, k, v, causal=True, flash_kernel=flash_kernel, return_lse=True)
    o.backward(do)
    check_against_reference(torch.bfloat16, q, k, v, do, o, lse, causal=True)
    with pytest.raises(ValueError, match="'cudnn' on cuda runs none of them"):
        rt.attention(q, k, v, impl="cudnn", flash_kernel=flash_kernel)

@pytest.mark.parametrize("impl, flash_kernel", EVERY_CUDA_KERNEL)
@pytest.mark.parametrize("qkv_format, axes", [("bhsd", (0, 2, 1, 3)), ("sbhd", (1, 0, 2, 3))])
def test_tensors_in_another_format_are_read_as_they_lie(impl, flash_kernel, qkv_format, axes):
    # bhsd / sbhd tensors reach the kernels as strided views, no copy (the wgmma kernels' TMA boxes too): results
    # and gradients as the f64 reference's, as the call on contiguous bshd tensors checks them.
    shape = dict(T=128, S=192) if impl == "cudnn" else dict(T=45, S=77)
    q, k, v, do = tensors(7, torch.bfloat16, D=128, **shape)
    leaves = [x.detach().permute(axes).contiguous().requires_grad_() for x in (q, k, v)]
    o_f, lse = attention_unless_no_hopper(*leaves, causal=True, impl=impl, flash_kernel=flash_kernel,
                                          qkv_format=qkv_format, return_lse=True)
    o_f.backward(do.permute(axes).contiguous())
    for leaf, x in zip(leaves, (q, k, v)):
        x.grad = leaf.grad.permute(axes)
    check_against_reference(torch.bfloat16, q, k, v, do, o_f.permute(axes), lse, causal=True)


@pytest.mark.parametrize("impl, flash_kernel", EVERY_CUDA_KERNEL)
def test_q_k_v_as_head_slices_of_one_fused_projection(impl, flash_kernel):
    # A fused QKV projection's output (B, T, Hq + 2 Hkv, D) cut by heads: strided rows, read as they lie.
    q, k, v, do = tensors(8, torch.bfloat16, T=128, S=128, D=128)
    fused = torch.cat([q, k, v], dim=2).detach().requires_grad_()
    parts = fused.split([8, 2, 2], dim=2)
    o, lse = attention_unless_no_hopper(*parts, causal=True, impl=impl, flash_kernel=flash_kernel, return_lse=True)
    o.backward(do)
    for x, grad in zip((q, k, v), fused.grad.split([8, 2, 2], dim=2)):
        x.grad = grad
    check_against_reference(torch.bfloat16, q, k, v, do, o, lse, causal=True)


def test_impl_auto_runs_cudnn_for_plain_calls_flash_attn2_for_options_and_sdpa_for_f32():
    q, k, v, do = tensors(9, torch.bfloat16, T=128, S=128, D=128)
    for options, kernels in ((dict(causal=True), "cudnn"), (dict(causal=True, sinks=torch.zeros(8, device=GPU)),
                             "flash_attn2"), (dict(window=(32, 0)), "flash_attn2")):
        o = rt.attention(q, k, v, impl="auto", **options)
        assert torch.equal(o, rt.attention(q, k, v, impl=kernels, **options)), (options, kernels)
        got = torch.autograd.grad(o, (q, k, v), do)
        want = torch.autograd.grad(rt.attention(q, k, v, impl=kernels, **options), (q, k, v), do)
        for a, b in zip(got, want):
            close(a, b, 1e-2)  # (dQ's atomics add in any order)
    rt._warned.clear()
    q32, k32, v32 = (x.detach().float() for x in (q, k, v))
    with pytest.warns(UserWarning, match="run the sdpa kernel"):
        o32 = rt.attention(q32, k32, v32, causal=True, impl="auto")
    assert torch.equal(o32, rt.attention(q32, k32, v32, causal=True, impl="sdpa"))


def test_call_temporaries_are_cached_between_calls_and_handed_back_on_request():
    # The carry of a forward and the f32 accumulators of a backward come from ringattn's cache: kept after
    # the call (so the next one neither maps memory nor waits for the GPU), given back by empty_cuda_cache().
    q, k, v, do = tensors(11, torch.bfloat16, T=256, S=256)
    o = rt.attention(q, k, v, impl="flash_attn2")
    o.backward(do)
    torch.cuda.synchronize()
    cached = ringattn.cuda_cache_bytes()
    carry = 2 * 8 * 256 * 64 * 4  # the forward's f32 numerator alone
    assert cached >= carry, cached
    q.grad = k.grad = v.grad = None
    again = rt.attention(q, k, v, impl="flash_attn2")
    again.backward(do)
    torch.cuda.synchronize()
    assert ringattn.cuda_cache_bytes() == cached  # reused, not grown
    torch.testing.assert_close(again, o, rtol=0, atol=0)
    ringattn.empty_cuda_cache()
    assert ringattn.cuda_cache_bytes() == 0


def test_deterministic_backward_gives_the_same_bits_on_every_run():
    # dQ's sums in a fixed order: three backwards of one problem on the GPU, bit for bit (many key blocks).
    runs = []
    for _ in range(3):
        q, k, v, do = tensors(12, torch.bfloat16, T=1500, S=2100)
        rt.attention(q, k, v, causal=True, deterministic=True).backward(do)
        runs.append((q.grad, k.grad, v.grad))
    for run in runs[1:]:
        for first, again in zip(runs[0], run):
            assert torch.equal(first, again)


VARLEN_BATCHES = {"equal": ([100, 1, 257, 0, 64], [100, 1, 257, 0, 64]),
                  "one_tensor": ([100, 1, 257, 0, 64], [100, 1, 257, 0, 64]),  # cu_seqlens_k is cu_seqlens_q
                  "cached_keys_each": ([100, 37, 64], [130, 37, 200])}


def test_attention_varlen_refuses_bad_lengths_on_the_gpu_after_queueing_its_call():
    q, k, v = (torch.randn(10, 4, 64, device=GPU, dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 6, 4, 10], dtype=torch.int32, device=GPU)
    with pytest.raises(ValueError, match="cu_seqlens_q must be non-decreasing: entry 2 is 4 after 6"):
        rt.attention_varlen(q, k, v, cu, cu, causal=True)
    torch.cuda.synchronize()  # the queued call ran on ids of any lengths without a fault


@pytest.mark.parametrize("impl", ["flash_attn2", "cudnn"])
@pytest.mark.parametrize("batch", list(VARLEN_BATCHES))
def test_attention_varlen_equals_the_f64_reference_of_each_sequence(impl, batch):
    """FlashAttention's varlen shapes on the GPU: flash_attn2 as one call with segment ids where it can,
    cudnn a call a sequence; o, lse and the gradients of a loss reading both against the f64 reference of
    each sequence alone (test_torch_varlen.py's)."""
    from test_torch_varlen import cumulative, per_sequence_reference

    lq, lk = VARLEN_BATCHES[batch]
    g = torch.Generator().manual_seed(21)
    dtype, H, Hkv, D = torch.bfloat16, 8, 2, 64
    q, k, v = (torch.randn(n, h, D, generator=g).to(GPU, dtype).requires_grad_()
               for n, h in ((sum(lq), H), (sum(lk), Hkv), (sum(lk), Hkv)))
    do = torch.randn(sum(lq), H, D, generator=g).to(GPU, dtype)
    dlse = torch.randn(H, sum(lq), generator=g).to(GPU) if impl != "cudnn" else torch.zeros(H, sum(lq), device=GPU)
    cu_q, cu_k = (torch.tensor(cumulative(x), dtype=torch.int32, device=GPU) for x in (lq, lk))
    if batch == "one_tensor":  # one call queued before the lengths are read back and checked
        cu_k = cu_q
    o, lse = rt.attention_varlen(q, k, v, cu_q, cu_k, impl=impl, causal=True, return_lse=True)
    ((o * do).sum() + ((lse * dlse).sum() if impl != "cudnn" else 0)).backward()
    want = per_sequence_reference(q, k, v, do, dlse, lq, lk, causal=True)
    tol = TOL[dtype]
    close(o.cpu(), torch.from_numpy(want[0]), tol)
    close(lse.cpu(), torch.from_numpy(want[1]), 1e-2)
    for leaf, ref in zip((q, k, v), want[2:5]):
        close(leaf.grad.cpu(), torch.from_numpy(ref), tol)


def hf_llama_twins(dtype, head_dim=64):
    """A small Llama on "ringattn" and its copy on Transformers' "sdpa" (PyTorch's SDPA), on the GPU."""
    transformers = pytest.importorskip("transformers", reason="Transformers is not installed")
    import copy
    import ringattn.hf

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=503, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                                      max_position_embeddings=4096, attn_implementation="sdpa")
    theirs = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).to(GPU).eval()
    mine = copy.deepcopy(theirs)  # (models made from one config share it, and so their attn_implementation)
    mine.set_attn_implementation(ringattn.hf.register())
    return mine, theirs


@pytest.mark.parametrize("head_dim", [64, 12])
def test_a_transformers_model_the_flash_kernels_cannot_take_runs_the_cuda_sdpa(head_dim):
    """impl="auto" on an f32 model (or head dims that are not multiples of 8) runs the CUDA sdpa, with a
    warning, where flash_attn2 would refuse the call: logits and gradients as Transformers' SDPA's."""
    mine, theirs = hf_llama_twins(torch.float32, head_dim)
    ids = torch.randint(0, 503, (2, 333), generator=torch.Generator().manual_seed(4)).to(GPU)
    mask = torch.ones_like(ids)
    mask[1, :50] = 0
    import ringattn.hf
    ringattn.hf._warned.clear()
    with pytest.warns(UserWarning, match="sdpa kernel"):
        got = mine(input_ids=ids, attention_mask=mask).logits
    want = theirs(input_ids=ids, attention_mask=mask).logits
    assert relative_error(got[mask.bool()], want[mask.bool()]) < 1e-4
    got[mask.bool()].sum().backward()
    want[mask.bool()].sum().backward()
    for (name, p), (_, q) in zip(mine.named_parameters(), theirs.named_parameters()):
        assert relative_error(p.grad, q.grad) < 1e-3, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_transformers_generation_with_a_static_cache_on_the_gpu(dtype):
    """Greedy decoding with a static KV cache on the GPU kernels (cudnn / flash_attn2 steps in bf16, the CUDA
    sdpa in f32), one row left-padded: the tokens and each step's logits equal a dynamic cache's, and the
    first step's logits Transformers' SDPA's."""
    mine, theirs = hf_llama_twins(dtype)
    ids = torch.randint(0, 503, (2, 45), generator=torch.Generator().manual_seed(5)).to(GPU)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    runs = {}
    for cache in ("dynamic", "static"):
        runs[cache] = mine.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                                    cache_implementation=cache, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(runs["static"].sequences, runs["dynamic"].sequences)
    for a, b in zip(runs["static"].logits, runs["dynamic"].logits):
        assert relative_error(a, b) < 1e-2
    want = theirs.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False, pad_token_id=0,
                           output_logits=True, return_dict_in_generate=True).logits[0]
    assert relative_error(runs["static"].logits[0], want) < (3e-2 if dtype == torch.bfloat16 else 1e-4)


def test_a_compiled_transformers_model_on_the_gpu():
    """torch.compile (in one graph from PyTorch 2.15) of a bf16 Llama on "ringattn" with packed documents
    (segment ids on flash_attn2) and left padding: logits and gradients as Transformers' SDPA's in eager."""
    from test_hf import FULLGRAPH
    mine, theirs = hf_llama_twins(torch.bfloat16)
    compiled = torch.compile(mine, fullgraph=FULLGRAPH)
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 503, (1, 600), generator=g).to(GPU)
    positions = torch.cat([torch.arange(n) for n in (250, 1, 349)])[None].to(GPU)
    for inputs in (dict(position_ids=positions), dict(attention_mask=(torch.arange(600) >= 40)[None].long().to(GPU))):
        keep = inputs["attention_mask"].bool() if "attention_mask" in inputs else torch.ones_like(ids, dtype=torch.bool)
        mine.zero_grad(), theirs.zero_grad()
        got = compiled(input_ids=ids, use_cache=False, **inputs).logits
        want = theirs(input_ids=ids, use_cache=False, **inputs).logits
        assert relative_error(got[keep], want[keep]) < 3e-2
        got[keep].float().sum().backward()
        want[keep].float().sum().backward()
        for (name, p), (_, q) in zip(mine.named_parameters(), theirs.named_parameters()):
            assert relative_error(p.grad, q.grad) < 5e-2, name


# A training step captured into a CUDA graph (torch.cuda.graph): each kernel family, options beside. `call`
# picks the kernels, `semantics` is what the f64 reference computes too.
CAPTURED_STEPS = {
    "flash_wgmma_causal": (dict(impl="flash_attn2", flash_kernel="wgmma"), dict(causal=True), dict(T=45, S=77)),
    "flash_mma_sync_window_softcap": (dict(impl="flash_attn2", flash_kernel="mma_sync"),
                                      dict(window=(20, 5), softcap=5.0), dict(T=45, S=77)),
    "flash_deterministic": (dict(impl="flash_attn2", deterministic=True), dict(causal=True), dict(T=300, S=700)),
    "flash_segment_ids": (dict(impl="flash_attn2"), dict(causal=True), dict(T=64, S=64)),
    "cudnn": (dict(impl="cudnn"), dict(causal=True), dict(T=128, S=128)),
    "sdpa": (dict(impl="sdpa"), dict(causal=True, scale=0.3), dict(T=31, S=45)),
    # A bias that takes no gradient (an attention mask as a float bias); bias and sinks that take theirs,
    # written into arrays of PyTorch's allocator, which the graph owns.
    "flash_bias_without_gradient": (dict(impl="flash_attn2"), dict(causal=True), dict(T=45, S=77)),
    "flash_bias_and_sinks_gradients": (dict(impl="flash_attn2"), dict(causal=True), dict(T=45, S=77)),
    "sdpa_bias_and_sinks_gradients": (dict(impl="sdpa"), dict(), dict(T=31, S=45)),
}


def refill(seed, *static):
    """New values into the captured step's inputs, in place (a graph replays on the same addresses)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for x in static:
            x.copy_(torch.randn(x.shape, generator=g))


@pytest.mark.parametrize("case", list(CAPTURED_STEPS))
def test_a_training_step_captured_in_a_cuda_graph_replays_on_new_inputs(case):
    # The graph owns every scratch buffer of the captured calls (a kept one would be regrown, and freed, by
    # the larger eager calls between the replays); positions are written on the device, not copied from the
    # host. Each replay's o, lse and gradients against the f64 reference of that replay's inputs.
    call, semantics, shape = CAPTURED_STEPS[case]
    q, k, v, do = tensors(21, torch.bfloat16, **shape)
    call = dict(flash_kernel="auto") | call
    if case == "flash_segment_ids":  # packed documents
        ids = torch.tensor([[0] * 20 + [1] * 30 + [2] * 14, [0] * 64]).int().to(GPU)
        semantics = dict(semantics, segment_ids=ids, kv_segment_ids=ids)
    parameters = []  # (leaf, the reference's name of its gradient)
    if "_bias" in case:
        with_gradients = case.endswith("_gradients")
        bias = torch.randn(2, 1, shape["T"], shape["S"], device=GPU).requires_grad_(with_gradients)
        semantics = dict(semantics, bias=bias)
        if with_gradients:
            sinks = torch.randn(8, device=GPU).requires_grad_()
            semantics = dict(semantics, sinks=sinks)
            parameters = [(bias, "dbias"), (sinks, "dsinks")]

    def step():
        for x in (q, k, v, *(leaf for leaf, _ in parameters)):
            x.grad = None
        o, lse = attention_unless_no_hopper(q, k, v, return_lse=True, **call, **semantics)
        o.backward(do)
        return o, lse

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as PyTorch asks: plans built, kernels loaded
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = step()
    refilled = [q, k, v, do] + [x for x in (semantics.get("bias"), semantics.get("sinks")) if x is not None]
    for replay in range(3):
        refill(100 + replay, *refilled)
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(torch.bfloat16, q, k, v, do, o, lse, extra=parameters, **semantics)
        # Larger eager calls between replays regrow what the implementation keeps between calls.
        big = tensors(30 + replay, torch.bfloat16, T=4 * shape["T"], S=4 * shape["S"])
        attention_unless_no_hopper(*big[:3], **call, causal=True).backward(big[3])


def test_what_a_cuda_graph_cannot_replay_is_refused_by_name_before_any_work():
    # Dropout (a replay would draw the captured mask again) and a gradient returned in ringattn's own memory
    # (which the graph cannot own: ringattn.attention_backward without out= arrays for it) are refused by
    # name, and the stream is left fit for the next capture and for eager calls.
    q, k, v, do = tensors(13, torch.bfloat16, T=128, S=128)
    sinks = torch.randn(8, device=GPU).requires_grad_()
    eager = rt.attention(q, k, v, causal=True)
    o, lse = rt.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)  # and the warm-up
    o.backward(do)
    o, lse = o.detach(), lse.detach()
    side = torch.cuda.Stream()
    plain = lambda **kw: ringattn.attention_backward(q.detach(), k.detach(), v.detach(), o, lse, do,  # noqa: E731
                                                     causal=True, sinks=sinks.detach(), stream=side.cuda_stream, **kw)
    calls = [(lambda: rt.attention(q, k, v, causal=True, dropout=0.1, dropout_seed=3).backward(do),
              "dropout .* cannot be captured into a CUDA graph"),
             (lambda: plain(), "a backward's gradients cannot be captured into a CUDA graph when they are returned"),
             (lambda: plain(out=tuple(torch.empty_like(x) for x in (q, k, v))),
              "the gradient of sinks cannot be captured into a CUDA graph when it is returned in device memory")]
    for call, refusal in calls:
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(ValueError, match=refusal):
            with torch.cuda.graph(graph, stream=side):
                call()
    graph = torch.cuda.CUDAGraph()
    x = torch.ones(4, device=GPU)
    with torch.cuda.graph(graph, stream=side):
        y = x * 2
    graph.replay()
    assert torch.equal(y, torch.full((4,), 2.0, device=GPU))
    torch.testing.assert_close(rt.attention(q, k, v, causal=True), eager, rtol=0, atol=0)


def test_torch_compile_reduce_overhead_replays_a_cuda_graph_of_the_step():
    # mode="reduce-overhead" records the compiled forward and backward into CUDA graphs (none skipped) and
    # replays them: the same output and gradients as eager, call after call on new inputs.
    from torch._dynamo.utils import counters

    torch.manual_seed(8)
    block = ProjectedAttention(lambda o: o.square().mean()).to(GPU, torch.bfloat16)
    compiled = torch.compile(block, mode="reduce-overhead")
    counters.clear()
    for step in range(4):
        x = torch.randn(2, 67, 128, device=GPU, dtype=torch.bfloat16)
        block.zero_grad()
        eager = block(x)
        eager.backward()
        want = [p.grad.clone() for p in block.parameters()]
        block.zero_grad()
        got = compiled(x)
        got.backward()
        close(got.detach(), eager.detach(), 1e-2)
        for g, w in zip((p.grad for p in block.parameters()), want):
            close(g, w, 3e-2)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
