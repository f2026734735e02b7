"""ringattn from Python: attention and its backward on one process's arrays, and ring attention over
the ranks of an mpi4py communicator.

Arrays cross into the C++ core through DLPack without copies (numpy, PyTorch, JAX or CuPy arrays, in
host memory or on a CUDA device) and the results come back as arrays of the same framework, where q
lives. Every array of a call lives where q does; on a device the call runs on q's GPU with its CUDA
implementations, its work queued on `stream` (a cudaStream_t as an integer; None: the legacy default
stream), so the results are ready for later work on that stream, as DLPack's exchange expects. With
`out=` the results are written into the caller's arrays (contiguous, where q lives; o in q's dtype or
float32, lse float32; gradients in q's dtype or float32) and those are returned: no allocation for them. Shapes follow
the seeds: q (B, T, Hq, D), k (B, S, Hkv, D), v (B, S, Hkv, Dv); o (B, T, Hq, Dv); lse (B, Hq, T) float32,
natural log. qkv_format= (TransformerEngine's names, the CLI's --qkv-format) takes q, k, v, o, do and returns
o and the gradients in another order: "bshd" (the above, the default), "bhsd" (B, H, T, D: PyTorch's
scaled_dot_product_attention), "sbhd" (T, B, H, D: Megatron's); as views, without copies. Given none, a q that
looks like another format (more heads than any model and than its tokens; batch rows of one query and one key)
draws a warning naming it. Keyword options, by the seeds' names: causal, window=(left, right)
(-1: unbounded), softcap, scale (0: 1/sqrt(D)), sinks (Hq,) float32, bias (B|1, Hq|1, T|1, S) float32,
mask (the same shape, bool / uint8, true = attend; both may drop leading 1s, as a (T, S) mask), mask_identity (a
nonzero int naming the mask's bytes: calls given the same one promise the same bytes at the same address, and the
GPU kernels then summarise the mask by tiles once instead of reading it whole in each call; ringattn.torch names
each mask tensor and version itself),
segment_ids (B, T) int32 and kv_segment_ids (B, S) (int64 ones, numpy's and PyTorch's default, are converted), dropout, dropout_seed (only
beside dropout: alone it would change nothing, and is refused), flash_kernel
("auto", "mma_sync" or "wgmma": which CUDA flash_attn2 kernels run; any other implementation refuses it). Bad input raises ValueError naming the tensor and dimension.
float64 arrays (bias and sinks float32 or float64) run impl="sdpa" on the host as the f64 reference: inputs,
arithmetic and results (o, lse, gradients) in float64, for finite-difference checks; the other implementations,
GPUs and rings take float32, float16 and bfloat16.
"""

import atexit

from . import _nvidia

_nvidia.load_from_wheels()  # before the core links them: the copies PyTorch and JAX use (ringattn/_nvidia.py)

from . import _core  # noqa: E402
from .formats import axes_of as _axes_of, explained as _explained, note_layout as _note_layout  # noqa: E402
from .formats import reorder as _reorder, to_core as _to_core  # noqa: E402

# The implementations kept between calls (their streams, device buffers, cuDNN graphs) are destroyed at
# interpreter exit, while CUDA is up, not by the process's exit handlers beside CUDA's own teardown.
atexit.register(_core.release_impls)

__all__ = ["attention", "attention_backward", "ring_attention", "ring_attention_backward", "shard", "unshard",
           "built_with_cuda", "release_rings", "ring_stats", "NcclComm", "nccl_unique_id", "cuda_cache_bytes", "empty_cuda_cache",
           "set_cuda_cache_limit"]

built_with_cuda = _core.built_with_cuda  # whether CUDA arrays can be passed (this build has the GPU back end)
# The GPU ring's communicator without MPI: rank 0 makes nccl_unique_id(), the caller carries the bytes to
# every rank (e.g. torch.distributed.broadcast_object_list), each makes NcclComm(id, rank, size, device).
NcclComm = _core.NcclComm
nccl_unique_id = _core.nccl_unique_id
# A call's device temporaries (carries, f32 accumulators) come from ringattn's own cache, kept for the
# next call so that none maps fresh memory or waits for the GPU. PyTorch's allocator cannot see it: where
# it runs short, empty_cuda_cache() hands ringattn's cache back, or set_cuda_cache_limit(bytes) bounds it.
cuda_cache_bytes = _core.cuda_cache_bytes
empty_cuda_cache = _core.empty_cuda_cache
set_cuda_cache_limit = _core.set_cuda_cache_limit


def _stream(stream):
    return 0 if stream is None else int(stream)


def _refused(name, value, expected):
    shown = repr(value)
    return ValueError("%s is %s of type %s: expected %s" % (name, shown if len(shown) <= 40 else shown[:37] + "...",
                                                           type(value).__name__, expected))


def _flag(name, value):
    """A keyword argument that is a bool (Python's or numpy's): anything else is refused by name, since a string
    such as "false" would read as true."""
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")):
        return bool(value)
    raise _refused(name, value, "a bool")


def _word(name, value):
    """A keyword argument that is a str (an implementation, a layout, a wire)."""
    if isinstance(value, str):
        return value
    raise _refused(name, value, "a str")


def _length(name, value):
    """None, or a keyword argument that is an integer (Python's or numpy's)."""
    if value is None:
        return None
    if not isinstance(value, bool) and hasattr(value, "__index__"):
        return value.__index__()
    raise _refused(name, value, "None or an integer")


def _int32_segments(options):
    """options with int64 segment ids (numpy's and PyTorch's default integers) as the core's int32, once
    their values are checked to fit."""
    for name in ("segment_ids", "kv_segment_ids"):
        x = options.get(name)
        if x is None or str(getattr(x, "dtype", "")).replace("torch.", "") != "int64":
            continue
        count = x.numel() if callable(getattr(x, "numel", None)) else x.size
        if count and not (-2**31 <= int(x.min()) and int(x.max()) < 2**31):
            raise ValueError("%s holds values outside int32's range (%d to %d): segment ids are int32" %
                             (name, int(x.min()), int(x.max())))
        options = dict(options)
        options[name] = x.int() if type(x).__module__.startswith("torch") else x.astype("int32")
    return options


def _four_dims(x):
    """x with leading 1s up to 4 dimensions (numpy's broadcasting: a (T, S) mask as PyTorch's SDPA takes it);
    the core takes biases and masks as (B|1, Hq|1, T|1, S)."""
    ndim = getattr(x, "ndim", 4)
    return x if x is None or not 1 <= ndim < 4 else x.reshape((1,) * (4 - ndim) + tuple(x.shape))


def _call_options(options):
    """options as the core takes them: Python bools, int32 segment ids, 4-dimensional bias and mask."""
    options = _int32_segments(options)
    if any(name in options for name in ("causal", "deterministic")):
        options = dict(options, **{name: _flag("option " + name, options[name]) for name in ("causal", "deterministic")
                                   if name in options})
    if any(_four_dims(options.get(name)) is not options.get(name) for name in ("bias", "mask")):
        options = dict(options, **{name: _four_dims(options[name]) for name in ("bias", "mask") if name in options})
    return options


def _names_dbias(out, options):
    """Whether a backward's out= holds a dbias entry (an array, or None: not formed)."""
    return out is not None and options.get("bias") is not None and len(out) > 3


def _gradient_out(out, options):
    """A backward's out= as the core takes it: its dbias 4-dimensional, as the bias."""
    if not _names_dbias(out, options) or out[3] is None:
        return out
    return tuple(out[:3]) + (_four_dims(out[3]),) + tuple(out[4:])


def _in_bias_shape(grads, options, out):
    """The backward's gradients with dbias (after dq, dk, dv) back in the shape the bias was given in: the
    caller's own array (or None) where out= named it."""
    bias = options.get("bias")
    if bias is None or (getattr(bias, "ndim", 4) >= 4 and not _names_dbias(out, options)):
        return grads
    grads = list(grads)
    grads[3] = out[3] if _names_dbias(out, options) else grads[3].reshape(tuple(bias.shape))
    return tuple(grads)


def _in_format(axes, results, count):
    """results (an array, or a tuple whose first `count` are token-major) back in the caller's format."""
    if axes is None:
        return results
    if not isinstance(results, tuple):
        return _reorder(results, axes, "o")
    return tuple(_reorder(x, axes, "result") if i < count else x for i, x in enumerate(results))


def _format_out(out, qkv_format):
    """out=, which the core writes as contiguous (B, T, H, X) arrays: refused beside another qkv_format."""
    if out is not None and _axes_of(qkv_format) is not None:
        raise ValueError("out= takes contiguous (batch, len, heads, dim) arrays, which qkv_format %r does not hold: "
                         "leave out= out (the results come back as %r views)" % (qkv_format, qkv_format))
    return out


def attention(q, k, v, *, impl="flash_attn2", return_lse=False, out=None, stream=None, qkv_format=None, **options):
    """o = attention of q over k and v on this process; (o, lse) with return_lse=True.

    impl: "flash_attn2", "sdpa" or "blockwise" on the host; "flash_attn2", "sdpa" or "cudnn" on a GPU.
    out: None, or (o, lse) arrays to write into. qkv_format: "bshd" (None), "bhsd" or "sbhd" (module docstring).
    """
    out = _format_out(out, qkv_format)
    impl, return_lse = _word("impl", impl), _flag("return_lse", return_lse)
    axes, (q, k, v) = _to_core(qkv_format, (("q", q), ("k", k), ("v", v)))
    _note_layout(q, k, qkv_format)  # (given no format, q and k as given)
    results = _explained(qkv_format, lambda: _core.attention(q, k, v, impl, _call_options(options), return_lse,
                                                             out, _stream(stream), q))
    return _in_format(axes, results, 1)


def attention_backward(q, k, v, o, lse, do, *, dlse=None, impl="flash_attn2", f32_gradients=False, out=None,
                       stream=None, qkv_format=None, **options):
    """(dq, dk, dv[, dbias][, dsinks]) of attention(q, k, v, **options), given its o, lse and do = dLoss/do.

    dlse: None, or dLoss/dlse (B, Hq, T) float32 where the loss reads lse too (as merging partial outputs by
    their lse does); not taken by impl="cudnn", whose backward forms rowsum(do * o) itself.

    The options must be the forward's. dq, dk, dv come in q's dtype (float32 with f32_gradients=True),
    dbias in the bias's shape, dsinks (Hq,) float32. out: None, or (dq, dk, dv) arrays to write into; where the
    call has a bias or sinks, (dq, dk, dv[, dbias][, dsinks]) too (float32), None for a gradient not needed (a
    bias that is an attention mask): that one is not formed at all (its sums skipped) and comes back None.
    deterministic=True (an option, as FlashAttention's): on a GPU the same bits on every run (dQ summed in
    a fixed order, up to 16 float32 copies of dq; cudnn's deterministic algorithm; the gradient of a bias
    broadcast over batch, heads, rows or keys, which a GPU sums by atomics, is refused with it there); host
    backwards are anyway, that gradient included.
    qkv_format: the forward's; o and do in it, dq, dk, dv returned in it.
    """
    out = _format_out(out, qkv_format)
    impl, f32_gradients = _word("impl", impl), _flag("f32_gradients", f32_gradients)
    axes, (q, k, v, o, do) = _to_core(qkv_format, (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)))
    grads = _explained(qkv_format, lambda: _core.attention_backward(
        q, k, v, o, lse, do, dlse, impl, _call_options(options), f32_gradients, _gradient_out(out, options),
        _stream(stream), q))
    return _in_bias_shape(_in_format(axes, tuple(grads), 3), options, out)


def ring_attention(q, k, v, *, comm, layout="zigzag", global_q_len=None, global_kv_len=None,
                   local_impl="flash_attn2", timeout=60.0, deterministic=False, return_lse=False, out=None, stream=None,
                   qkv_format=None, **options):
    """Ring attention of this rank's shard over every rank of `comm` (an mpi4py communicator, or an NcclComm
    for CUDA arrays without MPI).

    On CUDA arrays the GPU ring runs (copy engines between ranks of one node, NCCL across nodes, one GPU
    per rank or ranks sharing one; over an NcclComm: NCCL, one GPU per rank).

    q, k, v are this rank's rows of the global sequence under `layout` ("contiguous", "zigzag",
    "striped"; shard() cuts them); the global lengths default to the sum over the ranks. Returns this
    rank's rows of o (and lse). Every rank calls it with the same options; a rank whose arguments are
    refused stops every rank at once, the others quoting its reason, and a rank that stops makes the
    others fail after `timeout` seconds instead of hanging.

    deterministic=True: host arrays give the same bits for any number of ranks and any layout (exact sums,
    tens of times slower), its backward too when ring_attention_backward is called with it; CUDA arrays the
    same bits on every run for this number of ranks and layout (the backward's sums in a fixed order).
    qkv_format: as attention's (shard() cuts the format's len axis: 2 for "bhsd", 0 for "sbhd").
    """
    try:
        out = _format_out(out, qkv_format)
        layout, local_impl = _word("layout", layout), _word("local_impl", local_impl)
        global_q_len, global_kv_len = _length("global_q_len", global_q_len), _length("global_kv_len", global_kv_len)
        deterministic, return_lse = _flag("deterministic", deterministic), _flag("return_lse", return_lse)
        axes, (q, k, v) = _to_core(qkv_format, (("q", q), ("k", k), ("v", v)))
        _note_layout(q, k, qkv_format)  # (given no format, q and k as given)
        call_options, call_stream = _call_options(options), _stream(stream)
    except Exception as error:
        _refuse_on_every_rank(lambda: comm, timeout, error)
        raise
    results = _explained(qkv_format, lambda: _core.ring_attention(
        q, k, v, comm, layout, global_q_len, global_kv_len, local_impl, float(timeout), deterministic, "f32",
        call_options, return_lse, out, call_stream, q))
    return _in_format(axes, results, 1)


def ring_attention_backward(q, k, v, o, lse, do, *, comm, dlse=None, layout="zigzag", global_q_len=None,
                            global_kv_len=None, local_impl="flash_attn2", timeout=60.0, deterministic=False,
                            grad_wire="f32", f32_gradients=False, out=None, stream=None, qkv_format=None, **options):
    """This rank's (dq, dk, dv[, dbias][, dsinks]) of ring_attention(), given its o, lse and do (and dlse, this
    rank's rows of dLoss/dlse, where the loss reads lse: as attention_backward's).

    dK / dV accumulate in float32 around the ring (grad_wire="bf16": they travel in bfloat16, half the
    traffic, each hop rounding the running sum); dsinks and the dbias of a bias shared by every rank's
    rows are summed over the ranks. deterministic=True: host arrays give the same bits for any number of
    ranks and any layout, given o and lse of a deterministic forward; CUDA arrays the same bits on every run
    for this number of ranks and layout (dQ summed in a fixed order: up to 16 float32 copies of dq).
    qkv_format: the forward's; o and do in it, dq, dk, dv returned in it. out: as attention_backward's (every
    rank names the same gradients: the ranks sum dsinks together).
    """
    try:
        out = _format_out(out, qkv_format)
        layout, local_impl = _word("layout", layout), _word("local_impl", local_impl)
        global_q_len, global_kv_len = _length("global_q_len", global_q_len), _length("global_kv_len", global_kv_len)
        deterministic, f32_gradients = _flag("deterministic", deterministic), _flag("f32_gradients", f32_gradients)
        grad_wire = _word("grad_wire", grad_wire)
        axes, (q, k, v, o, do) = _to_core(qkv_format, (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)))
        call_options, gradient_out, call_stream = _call_options(options), _gradient_out(out, options), _stream(stream)
    except Exception as error:
        _refuse_on_every_rank(lambda: comm, timeout, error)
        raise
    grads = _explained(qkv_format, lambda: _core.ring_attention_backward(
        q, k, v, o, lse, do, dlse, comm, layout, global_q_len, global_kv_len, local_impl, float(timeout),
        deterministic, grad_wire, call_options, f32_gradients, gradient_out, call_stream, q))
    return _in_bias_shape(_in_format(axes, tuple(grads), 3), options, out)


def _refuse_on_every_rank(comm_of, timeout, error):
    """This rank's own checks of a ring call's arguments, before the core's, raised `error`: it joins the call's
    first agreement with it over comm_of()'s communicator, so that every rank stops at once quoting it, as for
    an error of the core's checks; the caller then raises it."""
    try:
        seconds = float(timeout) if isinstance(timeout, (int, float)) else 60.0  # (the core takes <= 0 as 60)
        _core.refuse_ring_call(comm_of(), seconds, f"{type(error).__name__}: {error}")
    except Exception:  # noqa: BLE001  (a comm that cannot agree: the call's own error is what is raised)
        pass


def ring_stats():
    """What the process's last ring_attention / ring_attention_backward call did (PyTorch's backward
    included, which runs on its own threads), as a dict: "steps" (ring
    steps), "skipped" (steps whose K/V block no query of this rank could see, by the causal mask or the
    window), "transport" (how the blocks travelled: "mpi", "python" (a torch.distributed group), "nccl" or
    "copy-engines"), "compute_seconds" (host time folding blocks; on a GPU, queuing the kernels) and
    "wait_seconds" (host time blocked on exchanges after the compute). None before the first call."""
    return _core.ring_stats()


def release_rings():
    """Frees the rings ring_attention keeps between calls over an mpi4py communicator (up to 4
    configurations: layout, lengths, implementation, device; on GPUs their K/V windows, mappings and NCCL
    communicators). Collective: every rank calls it. Kept rings are otherwise left to the process's exit."""
    _core.release_rings()


def _sequence_axis(x, axis, what):
    """axis as an index into x's dimensions (negative counts from the end), refused by name outside them."""
    ndim = len(x.shape)
    if isinstance(axis, bool) or not hasattr(axis, "__index__") or not -ndim <= axis.__index__() < ndim:
        raise ValueError("%s: axis %r is not a dimension of an array of shape %s" % (what, axis, tuple(x.shape)))
    return axis.__index__() % ndim


def shard(x, axis, layout, rank, size):
    """Rank `rank`'s rows (of `size` ranks) of the global sequence axis `axis` of x under `layout`."""
    axis = _sequence_axis(x, axis, "shard")
    size, rank = _length("size", size), _length("rank", rank)
    if size is None or rank is None or size < 1 or not 0 <= rank < size:
        raise ValueError("shard: rank %r of size %r, expected 0 <= rank < size" % (rank, size))
    rows = _core.layout_indices(_word("layout", layout), x.shape[axis], size, rank)
    return x[(slice(None),) * axis + (rows,)]


def unshard(shards, axis, layout):
    """The global array from every rank's shard (a list in rank order, uneven lengths too): a PyTorch
    tensor from PyTorch shards (on their device), numpy otherwise."""
    size = len(shards)
    if size == 0:
        raise ValueError("unshard: no shards (a list of every rank's, in rank order)")
    first = shards[0]
    axis, layout = _sequence_axis(first, axis, "unshard"), _word("layout", layout)
    length = sum(s.shape[axis] for s in shards)
    shape = list(first.shape)
    shape[axis] = length
    if type(first).__module__.startswith("torch"):
        out = first.new_empty(shape)
    else:
        import numpy as _np  # here: importing ringattn needs no numpy (its stubs are made without it)

        first = _np.asarray(first)
        out = _np.empty(shape, dtype=first.dtype)
    for rank, part in enumerate(shards):
        rows = _core.layout_indices(layout, length, size, rank)
        if part.shape[axis] != len(rows):  # (shards out of rank order, or of another layout)
            raise ValueError("unshard: shard %d has %d rows along axis %d, but the %s layout of %d rows over %d ranks "
                             "gives rank %d %d: pass every rank's shard, in rank order" %
                             (rank, part.shape[axis], axis, layout, length, size, rank, len(rows)))
        out[(slice(None),) * axis + (rows,)] = part
    return out
