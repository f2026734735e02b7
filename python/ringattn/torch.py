"""ringattn for PyTorch: attention and ring attention as differentiable custom ops.

`attention(q, k, v, ...)` on one process and `ring_attention(q, k, v, comm=..., ...)` over the ranks of an
mpi4py communicator (CPU or CUDA tensors) or of a torch.distributed group (CPU tensors in this version).
CUDA tensors run on their GPU, on PyTorch's current stream of that device. Both are `torch.library.custom_op`s with a fake
(meta) implementation, so `torch.compile` and `torch.export` trace them (and meta tensors give the results' shapes),
and a registered autograd formula that runs ringattn's backward (dq, dk, dv; dbias and dsinks where given):
torch.autograd takes the gradients, torch.func.vmap batches the calls, torch.func.grad / jvp are refused by name.
Tensors cross into the C++ core through DLPack without copies when contiguous.

Shapes are PyTorch's and the seeds': q (B, T, Hq, D), k (B, S, Hkv, D), v (B, S, Hkv, Dv) -> o (B, T, Hq, Dv);
qkv_format="bhsd" (or layout_bhtd=True) takes them (B, H, T, D) as F.scaled_dot_product_attention does, "sbhd"
(T, B, H, D) as Megatron does (views in, o back as a view; ringattn.formats). lse (B, Hq, T) float32 comes back
with return_lse=True and is differentiable: a loss that reads it (merging partial outputs by their lse, a z-loss)
gets its gradient (with impl="cudnn", whose backward takes no dlse, such a backward runs on flash_attn2's kernels).
Under torch.autocast, q, k and v are cast to its dtype, as F.scaled_dot_product_attention takes them.
float64 tensors (CPU, impl="sdpa") run the f64 reference forward and backward, lse float64 too: what
torch.autograd.gradcheck needs. Options, by the seeds' names: causal, window=(left, right) (-1: unbounded), softcap, scale (None:
1/sqrt(D)), sinks (Hq,) float32, bias (B|1, Hq|1, T|1, S) float32 (sinks and bias in another float dtype, as a
model holds them, are cast to float32 and get their gradients in their own dtype), mask (same shape, bool, true =
attend; leading 1s may be dropped, as a (T, S) mask; on a GPU summarised by tiles once per tensor and version, so
that a model's layers and the backward share one summary),
segment_ids (B, T) int32 and kv_segment_ids (B, S), dropout, dropout_seed, batch_offset / head_offset (a slice of
the batch or heads, as a data- or tensor-parallel rank holds: dropout keyed by the global indices); flash_kernel ("auto",
"mma_sync" or "wgmma": which CUDA flash_attn2 kernels run, refused by any other implementation).

`attention_varlen` / `ring_attention_varlen` take packed variable-length batches in FlashAttention's varlen
shapes (q (total_q, Hq, D) and cu_seqlens_q / cu_seqlens_k); ringattn.varlen says how they run.
"""

import hashlib
import itertools
import pathlib
import warnings
from typing import Optional

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack
from torch.utils.weak import WeakTensorKeyDictionary

from . import _core, _flag, varlen
from . import _four_dims, _int32_segments, _refuse_on_every_rank
from .formats import explained, note_layout, reorder, to_core
from . import shard as ringattn_shard

__all__ = ["attention", "ring_attention", "attention_varlen", "ring_attention_varlen", "DistributedComm"]


def _tag_compile_caches():
    """PyTorch's compile caches (FX graph, AOTAutograd) key a graph on its ops' names, not on a custom op's
    schema, fake or autograd formula (pytorch/pytorch#144344, #160472): a backward cached under another
    ringattn.torch would be replayed with that one's calls. Every cache key includes torch.compiler.config's
    cache_key_tag: this file's hash is added to it, so a changed ringattn.torch compiles afresh (a tag the user
    set is kept; one set after this import replaces ours)."""
    tag = "ringattn-" + hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:16]
    current = torch.compiler.config.cache_key_tag
    if tag not in current.split(","):
        torch.compiler.config.cache_key_tag = current + "," + tag if current else tag


_tag_compile_caches()


def _stream_of(x: Tensor) -> int:
    """PyTorch's current CUDA stream of x's device (0 on the host): ringattn queues its work there, so
    its results are ready for what PyTorch runs next on that stream."""
    return torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0


def _outputs(q: Tensor, v: Tensor):
    """o and lse for the forward, from PyTorch's allocator (its caching allocator on a GPU): ringattn
    writes into them instead of allocating (each of its own device frees waits for the whole device)."""
    return q.new_empty(q.shape[:3] + v.shape[3:]), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=_stats_dtype(q))


def _stats_dtype(q: Tensor):
    """lse's, dbias's and dsinks' dtype: float32, float64 for the f64 reference's float64 inputs."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _gradient_outputs(q: Tensor, k: Tensor, v: Tensor, bias=None, sinks=None, bias_grad=False, sinks_grad=False):
    """dq, dk, dv (contiguous, whatever the strides of q, k, v) for ringattn to write into; then, where the
    call has a bias or sinks, dbias and dsinks, None for one whose gradient is not needed (not formed)."""
    grads = (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape))
    if bias is None and sinks is None:
        return grads
    if bias is not None:
        grads += (bias.new_empty(bias.shape, dtype=_stats_dtype(q)) if bias_grad else None,)
    if sinks is not None:
        grads += (sinks.new_empty(sinks.shape, dtype=_stats_dtype(q)) if sinks_grad else None,)
    return grads


def _formed(grads):
    """The backward's gradients without those not formed (None)."""
    return [g for g in grads if g is not None]


def _plain(x: Tensor):
    """x for the core: a DLPack capsule of it detached from autograd and contiguous (no copy when it already
    is). The capsule, not the tensor: its __dlpack__ costs about 2 us a tensor in Python (ten a call), and
    the core orders its work after PyTorch's current stream itself."""
    return to_dlpack(x.detach().contiguous())


def _as_it_lies(x: Tensor):
    """q, k, v, o or do for the local kernels: a DLPack capsule of x itself where they read it as it lies (rows
    of contiguous elements at 16-byte-aligned addresses and strides, as a qkv_format="bhsd" or "sbhd" view and
    a KV cache's keys are), else of a contiguous copy (broadcasts of stride 0, odd offsets). A dimension of one
    element counts whatever its stride (the core gives it the contiguous one). The ring's calls take _plain: it
    sends its blocks as they lie in memory."""
    x = x.detach()
    size = x.element_size()
    as_is = (x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and
             all(n == 1 or (s > 0 and s * size % 16 == 0) for s, n in zip(x.stride()[:-1], x.shape[:-1])))
    return to_dlpack(x if as_is else x.contiguous())


def _maybe(x: Optional[Tensor]) -> Optional[Tensor]:
    return None if x is None else _plain(x)


# Names for the core of the masks' bytes (its mask_identity): one per tensor (the storage's root view) and version. The
# GPU kernels then summarise a mask once for all the calls that read it (a model's layers, each forward's backward)
# rather than reading it whole in each; writing into the tensor in place bumps its version, and with it the name.
# Writes PyTorch does not count (through .data, or another library's view of its memory) are not seen.
_mask_names = WeakTensorKeyDictionary()
_mask_name_counter = itertools.count(1)


def _version_of(x: Tensor) -> Optional[int]:
    """x's version (bumped by every in-place write PyTorch counts), or None for an inference tensor (one made under
    torch.inference_mode, which counts no writes): nothing read from such a tensor may be remembered."""
    return None if x.is_inference() else x._version


def _mask_identity(mask: Tensor) -> int:
    root = mask if mask._base is None else mask._base
    version = _version_of(root)
    if version is None:
        return 0  # summarised in every call
    named = _mask_names.get(root)
    if named is None or named[0] != version:
        named = (version, next(_mask_name_counter))
        _mask_names[root] = named
    return named[1]


def _options(sinks, bias, mask, segment_ids, kv_segment_ids, causal, window_left, window_right, softcap, scale,
             dropout, dropout_seed, batch_offset, head_offset, flash_kernel, deterministic=False):
    """The core's option dict from the ops' flat arguments (the custom-op schema takes no dicts)."""
    options = {"causal": causal, "softcap": softcap, "scale": scale, "dropout": dropout, "dropout_seed": dropout_seed,
               "batch_offset": batch_offset, "head_offset": head_offset, "flash_kernel": flash_kernel,
               "deterministic": deterministic}
    if (window_left, window_right) != (-1, -1):
        options["window"] = (window_left, window_right)
    for name, tensor in (("sinks", sinks), ("bias", bias), ("mask", mask), ("segment_ids", segment_ids),
                         ("kv_segment_ids", kv_segment_ids)):
        if tensor is not None:
            options[name] = tensor
    options = _int32_segments(options)  # on the tensors, then each as the core takes it
    if mask is not None and mask.is_cuda:
        options["mask_identity"] = _mask_identity(mask)
    for name in ("sinks", "bias", "mask", "segment_ids", "kv_segment_ids"):
        if name in options:
            options[name] = _plain(options[name])
    return options


class DistributedComm:
    """A torch.distributed process group (None: the default one) carrying the ring's messages, for the
    host ring under torchrun (gloo, CPU tensors). ringattn's C++ ring calls ring_shift and all_reduce."""

    def __init__(self, group=None):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError("group: torch.distributed is not initialized (call init_process_group first)")
        self._dist, self.group = dist, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        peer = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)  # noqa: E731
        self._next, self._previous = peer((self.rank + 1) % self.size), peer((self.rank - 1) % self.size)

    # The tensors handed to torch.distributed own their memory (copies of the ring's buffers, copied back
    # once the exchange is done): gloo's threads may release a work's tensors after the wait, even while
    # the interpreter shuts down, and a tensor over one of ringattn's buffers holds a Python object whose
    # release then aborts the process; nor can a late write land in a buffer the ring has freed after a
    # timeout.
    def ring_shift(self, send, recv, tag):
        outgoing, incoming = _bytes(send).clone(), torch.empty(len(recv), dtype=torch.uint8)
        ops = [self._dist.P2POp(self._dist.isend, outgoing, self._next, self.group),
               self._dist.P2POp(self._dist.irecv, incoming, self._previous, self.group)]
        return _Pending(self._dist.batch_isend_irecv(ops), lambda: _bytes(recv).copy_(incoming))

    timeout = 60.0  # seconds an all_reduce may wait for the other ranks: the calling ring's step timeout

    def all_reduce(self, values, dtype, op):
        ops = {"sum": self._dist.ReduceOp.SUM, "max": self._dist.ReduceOp.MAX, "min": self._dist.ReduceOp.MIN}
        tensor = torch.frombuffer(values, dtype=getattr(torch, dtype))
        owned = tensor.clone()
        _Pending([self._dist.all_reduce(owned, op=ops[op], group=self.group, async_op=True)],
                 lambda: tensor.copy_(owned)).wait(self.timeout)


def _bytes(view) -> Tensor:
    """A uint8 tensor over a memoryview, without a copy (frombuffer refuses empty buffers)."""
    return torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)


class _Pending:
    """Works in flight; `done` runs once every one of them has completed (copies the results back)."""

    def __init__(self, works, done=lambda: None):
        self._works, self._done = works, done

    def wait(self, timeout_seconds):
        import datetime

        for work in self._works:
            work.wait(datetime.timedelta(seconds=timeout_seconds))
        self._works = []
        self._done()


# Communicators by handle: a custom op's schema takes ints, not Python objects.
_communicators = {}
_group_comms = {}


def _nccl_comm_of(group, device: torch.device, timeout: float):
    """The group's NCCL communicator for the GPU ring on `device`, made once: rank 0 of the group makes the
    unique id and torch.distributed carries it to the others (collective over the group)."""
    import torch.distributed as dist

    key = (group, device.index)
    if key not in _group_comms:
        if not dist.is_initialized():
            raise ValueError("group: torch.distributed is not initialized (call init_process_group first)")
        if not _core.built_with_cuda():  # every rank alike, before the broadcast
            raise ValueError("q is a CUDA tensor but this build of ringattn has no CUDA back end")
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        unique_id = [None]
        if rank == 0:  # a failure here travels in place of the id, so that no rank waits for one
            try:
                unique_id = [_core.nccl_unique_id()]
            except Exception as e:  # noqa: BLE001
                unique_id = [f"{type(e).__name__}: {e}"]
        root = dist.get_global_rank(group, 0) if group is not None else 0
        # The id goes through the group's own backend: on the GPU where it has NCCL, in host memory for gloo.
        carrier = device if "nccl" in str(dist.get_backend(group)) else torch.device("cpu")
        dist.broadcast_object_list(unique_id, src=root, group=group, device=carrier)
        if isinstance(unique_id[0], str):
            raise ValueError(f"the group's first rank could not make an NCCL unique id: {unique_id[0]}")
        _group_comms[key] = _core.NcclComm(unique_id[0], rank, size, device.index, timeout)
    return _group_comms[key]


def _refuse_ring_call(comm, group, timeout, q, error):
    """This rank's checks of a ring call raised `error` before the call reached the core: it joins the call's
    first agreement over the call's communicator with it (ringattn._refuse_on_every_rank), so that every rank
    stops at once quoting it; the caller raises it."""
    device = q.device if isinstance(q, Tensor) else torch.device("cpu")
    _refuse_on_every_rank(lambda: _communicators[_handle_of(comm, group, float(timeout), device)], timeout, error)


def _handle_of(comm, group, timeout, device: torch.device) -> int:
    if comm is None and device.type == "cuda":  # the group's NCCL communicator, made once per group and device
        comm = _nccl_comm_of(group, device, timeout)
    elif comm is None:  # the group's torch.distributed carrier (gloo, host tensors), made once per group
        if group not in _group_comms:
            _group_comms[group] = DistributedComm(group)
        comm = _group_comms[group]
        comm.timeout = timeout
    _communicators[id(comm)] = comm
    return id(comm)


# Each op's body is a plain function (`*_raw`) too: eager calls reach it through a torch.autograd.Function
# (_eager_call), without the custom op's dispatch and autograd wrapper, which cost more than a small call's
# kernels. Arguments: q, k, v [, o, lse, do, dlse], then _options' 15 (sinks ... flash_kernel), then the rest.
def _attention_forward_raw(q, k, v, *rest):
    *options, deterministic, impl = rest
    return _core.attention(_as_it_lies(q), _as_it_lies(k), _as_it_lies(v), impl, _options(*options, deterministic),
                           True, _outputs(q, v), _stream_of(q), q)


def _attention_backward_raw(q, k, v, o, lse, do, dlse, bias_grad, sinks_grad, *rest):
    *options, deterministic, impl = rest
    sinks, bias = options[:2]
    out = _gradient_outputs(q, k, v, bias, sinks, bias_grad, sinks_grad)
    return _formed(_core.attention_backward(_as_it_lies(q), _as_it_lies(k), _as_it_lies(v), _as_it_lies(o),
                                            _plain(lse), _as_it_lies(do), _maybe(dlse), impl,
                                            _options(*options, deterministic), False, out, _stream_of(q), q))


def _ring_forward_raw(q, k, v, *rest):
    options, (comm, layout, global_q_len, global_kv_len, local_impl, timeout, deterministic, grad_wire) = rest[:15], rest[15:]
    return _core.ring_attention(_plain(q), _plain(k), _plain(v), _communicators[comm], layout, global_q_len,
                                global_kv_len, local_impl, timeout, deterministic, grad_wire, _options(*options), True,
                                _outputs(q, v), _stream_of(q), q)


def _ring_backward_raw(q, k, v, o, lse, do, dlse, bias_grad, sinks_grad, *rest):
    options, (comm, layout, global_q_len, global_kv_len, local_impl, timeout, deterministic, grad_wire) = rest[:15], rest[15:]
    sinks, bias = options[:2]
    out = _gradient_outputs(q, k, v, bias, sinks, bias_grad, sinks_grad)
    return _formed(_core.ring_attention_backward(_plain(q), _plain(k), _plain(v), _plain(o), _plain(lse), _plain(do),
                                                 _maybe(dlse), _communicators[comm], layout, global_q_len,
                                                 global_kv_len, local_impl, timeout, deterministic, grad_wire,
                                                 _options(*options), False, out, _stream_of(q), q))


@torch.library.custom_op("ringattn::attention_forward", mutates_args=())
def _attention_forward(q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor], bias: Optional[Tensor],
                       mask: Optional[Tensor], segment_ids: Optional[Tensor], kv_segment_ids: Optional[Tensor],
                       causal: bool, window_left: int, window_right: int, softcap: float, scale: float,
                       dropout: float, dropout_seed: int, batch_offset: int, head_offset: int, flash_kernel: str,
                       deterministic: bool, impl: str) -> tuple[Tensor, Tensor]:
    return _attention_forward_raw(q, k, v, sinks, bias, mask, segment_ids, kv_segment_ids, causal, window_left,
                                  window_right, softcap, scale, dropout, dropout_seed, batch_offset, head_offset,
                                  flash_kernel, deterministic, impl)


@torch.library.custom_op("ringattn::attention_backward", mutates_args=())
def _attention_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, dlse: Optional[Tensor],
                        bias_grad: bool, sinks_grad: bool, sinks: Optional[Tensor], bias: Optional[Tensor],
                        mask: Optional[Tensor], segment_ids: Optional[Tensor], kv_segment_ids: Optional[Tensor],
                        causal: bool, window_left: int, window_right: int,
                        softcap: float, scale: float, dropout: float, dropout_seed: int, batch_offset: int, head_offset: int,
                        flash_kernel: str, deterministic: bool, impl: str) -> list[Tensor]:
    return _attention_backward_raw(q, k, v, o, lse, do, dlse, bias_grad, sinks_grad, sinks, bias, mask, segment_ids,
                                   kv_segment_ids, causal, window_left, window_right, softcap, scale, dropout,
                                   dropout_seed, batch_offset, head_offset, flash_kernel, deterministic, impl)


@torch.library.custom_op("ringattn::ring_attention_forward", mutates_args=())
def _ring_forward(q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor], bias: Optional[Tensor],
                  mask: Optional[Tensor], segment_ids: Optional[Tensor], kv_segment_ids: Optional[Tensor],
                  causal: bool, window_left: int, window_right: int, softcap: float, scale: float, dropout: float,
                  dropout_seed: int, batch_offset: int, head_offset: int, flash_kernel: str, comm: int, layout: str,
                  global_q_len: Optional[int], global_kv_len: Optional[int], local_impl: str, timeout: float,
                  deterministic: bool, grad_wire: str) -> tuple[Tensor, Tensor]:
    return _ring_forward_raw(q, k, v, sinks, bias, mask, segment_ids, kv_segment_ids, causal, window_left,
                             window_right, softcap, scale, dropout, dropout_seed, batch_offset, head_offset, flash_kernel,
                             comm, layout, global_q_len, global_kv_len, local_impl, timeout, deterministic, grad_wire)


@torch.library.custom_op("ringattn::ring_attention_backward", mutates_args=())
def _ring_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, dlse: Optional[Tensor],
                   bias_grad: bool, sinks_grad: bool, sinks: Optional[Tensor], bias: Optional[Tensor],
                   mask: Optional[Tensor], segment_ids: Optional[Tensor], kv_segment_ids: Optional[Tensor],
                   causal: bool, window_left: int, window_right: int,
                   softcap: float, scale: float, dropout: float, dropout_seed: int, batch_offset: int, head_offset: int,
                   flash_kernel: str, comm: int, layout: str,
                   global_q_len: Optional[int], global_kv_len: Optional[int], local_impl: str,
                   timeout: float, deterministic: bool, grad_wire: str) -> list[Tensor]:
    return _ring_backward_raw(q, k, v, o, lse, do, dlse, bias_grad, sinks_grad, sinks, bias, mask, segment_ids,
                              kv_segment_ids, causal, window_left, window_right, softcap, scale, dropout, dropout_seed,
                              batch_offset, head_offset, flash_kernel, comm, layout, global_q_len, global_kv_len,
                              local_impl, timeout, deterministic, grad_wire)


# Fake implementations: output shapes and dtypes only, for torch.compile / torch.export tracing.
def _fake_forward(q, k, v, *rest):
    return _outputs(q, v)


def _fake_backward(q, k, v, o, lse, do, dlse, bias_grad, sinks_grad, sinks, bias, *rest):
    return _formed(_gradient_outputs(q, k, v, bias, sinks, bias_grad, sinks_grad))


for _op in (_attention_forward, _ring_forward):
    _op.register_fake(_fake_forward)
for _op in (_attention_backward, _ring_backward):
    _op.register_fake(_fake_backward)


# Autograd: the forward saves q, k, v, o, lse and the options; the backward calls the backward op with dO
# and, where the loss reads lse, dLSE (None otherwise: grads are not materialised).
def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.rest = inputs[3:]
    ctx.set_materialize_grads(False)


def _upstream(o, do, dlse):
    """dO (zeros where only lse reaches the loss) and dLSE (None where it does not)."""
    return (torch.zeros_like(o) if do is None else do.contiguous()), dlse


def _parameter_grads(ctx):
    """Whether the loss needs the gradients of the bias and of the sinks (the forward's inputs 4 and 3): one
    it does not (an attention mask given as a bias) is not formed by the backward at all."""
    return bool(ctx.needs_input_grad[4]), bool(ctx.needs_input_grad[3])


def _gradients(ctx, grads, bias_grad, sinks_grad):
    """(dq, dk, dv, None..., dsinks, dbias) in the forward op's argument order, from the backward's formed ones."""
    sinks, bias = ctx.rest[0], ctx.rest[1]
    dq, dk, dv = grads[:3]
    extra = list(grads[3:])
    dbias = extra.pop(0) if bias is not None and bias_grad else None
    dsinks = extra.pop(0) if sinks is not None and sinks_grad else None
    return (dq, dk, dv, dsinks, dbias) + (None,) * (len(ctx.rest) - 2)


def _backward_of(ctx, op, raw):
    """The backward op, or its body where the forward ran eagerly and no graph of the gradients is being
    made (create_graph=True goes through the op, whose autograd refuses a double backward by name)."""
    return raw if getattr(ctx, "eager", False) and not torch.is_grad_enabled() else op


def _attention_autograd(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    do, dlse = _upstream(o, do, dlse)
    rest = list(ctx.rest)
    if dlse is not None and rest[-1] == "cudnn":  # cuDNN's backward takes no dLSE: flash_attn2's kernels do
        rest[-1] = "flash_attn2"
    backward = _backward_of(ctx, _attention_backward, _attention_backward_raw)
    wanted = _parameter_grads(ctx)
    return _gradients(ctx, backward(q, k, v, o, lse, do, dlse, *wanted, *rest), *wanted)


def _ring_autograd(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    do, dlse = _upstream(o, do, dlse)
    rest = list(ctx.rest)
    local_impl = len(rest) - 4  # ..., global_kv_len, local_impl, timeout, deterministic, grad_wire
    if dlse is not None and rest[local_impl] == "cudnn":
        rest[local_impl] = "flash_attn2"
    backward = _backward_of(ctx, _ring_backward, _ring_backward_raw)
    wanted = _parameter_grads(ctx)
    return _gradients(ctx, backward(q, k, v, o, lse, do, dlse, *wanted, *rest), *wanted)


_attention_forward.register_autograd(_attention_autograd, setup_context=_setup_context)
_ring_forward.register_autograd(_ring_autograd, setup_context=_setup_context)


def _eager_function(forward_raw, autograd):
    """A torch.autograd.Function running forward_raw and the op's own autograd formula: what eager calls take."""

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            output = forward_raw(*inputs)
            _setup_context(ctx, inputs, output)
            ctx.eager = True
            return output

        @staticmethod
        def backward(ctx, do, dlse):
            return autograd(ctx, do, dlse)

    return Eager


_AttentionEager = _eager_function(_attention_forward_raw, _attention_autograd)
_RingEager = _eager_function(_ring_forward_raw, _ring_autograd)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _eager_call(op, eager, *inputs):
    """op(*inputs), or the same through its eager Function where nothing traces or transforms the call: no
    torch.compile / torch.export, no dispatch or function mode (FakeTensorMode, FlopCounterMode), no functorch
    transform, no tensor subclass (FakeTensor, DTensor). Those see the custom op; plain eager calls skip its
    dispatch (bench/RESULTS.md: the op's wrapper cost more than the kernels of a small call)."""
    if torch.compiler.is_compiling():
        return op(*inputs)
    transform = torch._C._functorch.peek_interpreter_stack()
    if transform is not None and transform.key() in (torch._C._functorch.TransformType.Grad,
                                                     torch._C._functorch.TransformType.Jvp):
        raise RuntimeError("ringattn's attention cannot run under torch.func.grad, vjp, jacrev or jvp (its "
                           "gradients are ringattn's kernels, not PyTorch operations a transform can trace): take "
                           "them with torch.autograd (loss.backward(), torch.autograd.grad); torch.func.vmap works")
    traced = (torch._C._len_torch_dispatch_stack() > 0 or
              torch._C._is_torch_function_mode_enabled() or transform is not None or
              any(isinstance(x, torch.Tensor) and (type(x) not in _PLAIN_TYPES or x.is_meta) for x in inputs))
    return op(*inputs) if traced else eager.apply(*inputs)


def _no_double_backward(ctx, *grads):
    raise RuntimeError("ringattn's attention backward is not differentiable itself: gradients of its gradients "
                       "(double backward, e.g. a gradient penalty) are not implemented")


for _op in (_attention_backward, _ring_backward):  # create_graph=True works until the graph is differentiated
    _op.register_autograd(_no_double_backward, setup_context=lambda ctx, inputs, output: None)


def _option_args(causal, window, softcap, scale, sinks, bias, mask, segment_ids, kv_segment_ids, dropout,
                 dropout_seed, batch_offset, head_offset, flash_kernel):
    """The ops' flat option arguments (masks and biases are (B, H, T, S) in both layouts)."""
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    bias, mask = _four_dims(bias), _four_dims(mask)  # views: dbias flows back in the bias's own shape
    return (sinks, bias, mask, segment_ids, kv_segment_ids, _flag("causal", causal), left, right,
            float(softcap or 0.0), float(scale or 0.0), float(dropout), int(dropout_seed), int(batch_offset),
            int(head_offset), str(flash_kernel))


def _format_of(qkv_format, layout_bhtd):
    """The call's qkv_format: layout_bhtd=True is "bhsd" (its older name)."""
    if not layout_bhtd:
        return qkv_format
    if qkv_format not in (None, "bhsd"):
        raise ValueError("layout_bhtd=True is qkv_format='bhsd', which qkv_format=%r contradicts: pass one" %
                         (qkv_format,))
    return "bhsd"


def _autocast(q, k, v):
    """q, k, v in autocast's dtype where autocast is on for their device, as F.scaled_dot_product_attention
    takes them (attention is one of its lower-precision ops): f32 activations under torch.autocast run the
    half-precision kernels (differentiably: their gradients come back in the leaves' dtype)."""
    device = q.device.type
    if device == "meta" or not torch.is_autocast_enabled(device):  # (meta has no autocast to ask)
        return q, k, v
    dtype = torch.get_autocast_dtype(device)
    return tuple(x.to(dtype) if x.is_floating_point() and x.dtype != torch.float64 else x for x in (q, k, v))


def _parameters_in_stats_dtype(sinks, bias, q):
    """sinks and bias in the dtype the kernels read them in (float32; float64 for the f64 reference), cast
    differentiably where a model holds them in its own dtype (gpt-oss's bf16 sinks, SDPA's attn_mask in
    q's dtype): their gradients come back in the dtype given. A cast bias is a (B, H, T, S) copy."""
    dtype = _stats_dtype(q)

    def cast(x):
        return x.to(dtype) if isinstance(x, Tensor) and x.is_floating_point() and x.dtype != dtype else x
    return cast(sinks), cast(bias)


_warned = set()


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=3)


def _asks_only_what_cudnn_expresses(option_args):
    """Whether the ops' option arguments (_option_args) ask nothing cuDNN lacks: no sinks, bias, mask, segment
    ids, window, soft cap, dropout or forced flash kernel."""
    sinks, bias, mask, segment_ids, kv_segment_ids, _, left, right, softcap, _, dropout, *_, flash_kernel = option_args
    return (all(x is None for x in (sinks, bias, mask, segment_ids, kv_segment_ids)) and (left, right) == (-1, -1)
            and not softcap and not dropout and flash_kernel == "auto")


_cudnn_refused = set()  # (D, Dv, dtype) the installed cuDNN refused: "auto" runs flash_attn2 there


def _automatic(impl, q, v, plain):
    """impl, or for "auto" the kernels for these tensors (q in the kernels' dtype, autocast's): on CUDA, cudnn
    where the call asks only what cuDNN expresses (plain: cuDNN's fused kernels, the fastest on Hopper for
    plain causal attention), flash_attn2 elsewhere (every option), the CUDA sdpa where the flash kernels cannot
    run (f32, head dims not multiples of 8 up to 256; with a warning); on the host flash_attn2, sdpa for f64."""
    if impl != "auto":
        return impl
    if not q.is_cuda:
        return "sdpa" if q.dtype == torch.float64 else "flash_attn2"
    dims = (q.shape[-1], v.shape[-1])
    if q.dtype not in (torch.float16, torch.bfloat16) or any(d > 256 or d % 8 for d in dims):
        _warn_once(("sdpa", q.dtype, dims), "ringattn: %s q / v with head dims %s on CUDA run the sdpa kernel (f32 "
                   "GEMMs a query chunk at a time: exact, slow); the flash kernels take bf16 / f16 (a model in bf16, "
                   "or torch.autocast) and head dims that are multiples of 8 up to 256" % (q.dtype, dims))
        return "sdpa"
    return "cudnn" if plain and (*dims, q.dtype) not in _cudnn_refused else "flash_attn2"


def _run_automatic(call, impl, q, v, plain):
    """call(implementation) with impl's choice (_automatic); under "auto", head dims the installed cuDNN refuses
    (it says so before any work, on every rank alike) run on flash_attn2, and are remembered."""
    chosen = _automatic(impl, q, v, plain)
    if impl != "auto" or chosen != "cudnn":
        return call(chosen)
    try:
        return call("cudnn")
    except ValueError as error:
        if "installed cuDNN" not in str(error):
            raise
        _cudnn_refused.add((q.shape[-1], v.shape[-1], q.dtype))
        return call("flash_attn2")


def attention(q, k, v, *, causal=False, window=None, softcap=None, scale=None, sinks=None, bias=None, mask=None,
              segment_ids=None, kv_segment_ids=None, dropout=0.0, dropout_seed=0, batch_offset=0, head_offset=0,
              impl="flash_attn2", flash_kernel="auto", deterministic=False, qkv_format=None, layout_bhtd=False,
              return_lse=False):
    """Attention of q over k and v on this process, differentiable: o, or (o, lse) with return_lse=True.

    impl: "flash_attn2", "sdpa" or "blockwise" on CPU tensors; "flash_attn2", "sdpa" or "cudnn" on CUDA
    tensors; "auto": cudnn on CUDA where the call asks nothing cuDNN lacks (no sinks, bias, mask, segment ids, soft
    cap, dropout, window or flash_kernel), flash_attn2 elsewhere, the CUDA sdpa (with a warning) for f32 or head
    dims the flash kernels do not take; on the host flash_attn2 (sdpa for f64). Gradients flow to q, k, v, and to bias and sinks where given. deterministic=True (as
    FlashAttention's): on CUDA tensors the backward gives the same bits on every run (dQ summed in a fixed
    order, slower; the gradient of a bias broadcast over batch, heads, rows or keys, summed by atomics there, is
    refused with it); CPU backwards do anyway, that gradient included. qkv_format: "bshd" (None: (B, T, H, D)), "bhsd" ((B, H, T, D), as
    F.scaled_dot_product_attention; layout_bhtd=True says the same) or "sbhd" ((T, B, H, D), Megatron's): q, k,
    v and o in it, as views.
    """
    qkv_format = _format_of(qkv_format, layout_bhtd)
    axes, (q, k, v) = to_core(qkv_format, (("q", q), ("k", k), ("v", v)))
    if not torch.compiler.is_compiling():  # (the core's rule, which a traced graph cannot call)
        note_layout(q, k, qkv_format)  # (given no format, q and k as given)
    q, k, v = _autocast(q, k, v)
    sinks, bias = _parameters_in_stats_dtype(sinks, bias, q)
    args = _option_args(causal, window, softcap, scale, sinks, bias, mask, segment_ids, kv_segment_ids, dropout,
                        dropout_seed, batch_offset, head_offset, flash_kernel)
    o, lse = _run_automatic(lambda chosen: explained(qkv_format, lambda: _eager_call(
        _attention_forward, _AttentionEager, q, k, v, *args, _flag("deterministic", deterministic), chosen)), impl, q, v,
        _asks_only_what_cudnn_expresses(args))
    o = reorder(o, axes, "o")
    return (o, lse) if return_lse else o


def ring_attention(q, k, v, *, comm=None, group=None, layout="zigzag", global_q_len=None, global_kv_len=None, causal=False, window=None,
                   softcap=None, scale=None, sinks=None, bias=None, mask=None, segment_ids=None, kv_segment_ids=None,
                   dropout=0.0, dropout_seed=0, batch_offset=0, head_offset=0, local_impl="flash_attn2", flash_kernel="auto",
                   timeout=60.0,
                   deterministic=False,
                   grad_wire="f32", qkv_format=None, layout_bhtd=False, return_lse=False):
    """Ring attention of this rank's shard over every rank of `comm`, differentiable.

    comm: an mpi4py communicator (under mpirun; CPU tensors, or CUDA tensors over the GPU ring), or a
    ringattn.NcclComm (CUDA tensors); without it, the torch.distributed process group `group` (None: the
    default one), under torchrun: for CPU tensors it carries the messages itself (gloo); for CUDA tensors
    it carries, once per group and device, the unique id of an NCCL communicator that the GPU ring then
    uses (one GPU per rank).

    q, k, v are this rank's rows of the global sequence under `layout` ("contiguous", "zigzag", "striped";
    ringattn.shard cuts them). local_impl: each rank's kernels, as attention's impl ("auto" as there, flash_attn2
    under the striped layout, whose rows cuDNN's calls cannot take). Every rank calls it (and its backward) with
    the same options; dK / dV
    accumulate in float32 around the ring (grad_wire="bf16": in bfloat16 on the wire, half the traffic). A
    rank whose arguments are refused stops every rank at once, the others quoting its reason; a rank that
    stops makes the others fail after `timeout` seconds. deterministic=True: on CPU tensors the same
    bits, forward and gradients, for any number of ranks and any layout (exact sums; tens of times slower); on
    CUDA tensors the same bits on every run for this number of ranks and layout (dQ summed in a fixed order).
    qkv_format: as attention's (ringattn.shard cuts the format's len axis). sinks and a bias shared by
    every query row (T|1 == 1) are replicated: each rank's gradient of them is its share, the ranks' sum the
    whole gradient, as every other parameter's is where data- or context-parallel training adds them up.
    """
    try:
        qkv_format = _format_of(qkv_format, layout_bhtd)
        axes, (q, k, v) = to_core(qkv_format, (("q", q), ("k", k), ("v", v)))
        if not torch.compiler.is_compiling():  # (the core's rule, which a traced graph cannot call)
            note_layout(q, k, qkv_format)  # (given no format, q and k as given)
        q, k, v = _autocast(q, k, v)
        sinks, bias = _shared_over_ranks(*_parameters_in_stats_dtype(sinks, bias, q), comm, group)
        args = _option_args(causal, window, softcap, scale, sinks, bias, mask, segment_ids, kv_segment_ids, dropout,
                            dropout_seed, batch_offset, head_offset, flash_kernel)
    except Exception as error:
        _refuse_ring_call(comm, group, timeout, q, error)
        raise
    handle = _handle_of(comm, group, float(timeout), q.device)
    plain = layout != "striped" and _asks_only_what_cudnn_expresses(args)  # (cudnn steps take runs of positions)
    o, lse = _run_automatic(lambda chosen: explained(qkv_format, lambda: _eager_call(
        _ring_forward, _RingEager, q, k, v, *args, handle, layout, global_q_len, global_kv_len, chosen, float(timeout),
        _flag("deterministic", deterministic), str(grad_wire))), local_impl, q, v, plain)
    o = reorder(o, axes, "o")
    return (o, lse) if return_lse else o


def _share_of_gradient(x: Tensor, size: int) -> Tensor:
    """x (the same bits) whose gradient comes back divided by size. The ring's backward sums the sinks'
    and a shared bias's gradients over every rank's rows, so each rank holds the whole sum; a replicated
    parameter's gradient is the rank's share (the ranks' sum is the whole), as every other parameter's is,
    for the all-reduce of data- and context-parallel training (DDP, FSDP) to add up once."""
    return x.detach() + (x - x.detach()) / size


def _shared_over_ranks(sinks, bias, comm, group):
    """sinks, and a bias shared by every query row (T|1 == 1), as their gradients' shares of the ranks."""
    shared_bias = bias is not None and _four_dims(bias).shape[2] == 1
    size = varlen.rank_and_size(comm, group)[1] if sinks is not None or shared_bias else 1
    if size > 1 and sinks is not None:
        sinks = _share_of_gradient(sinks, size)
    if size > 1 and shared_bias:
        bias = _share_of_gradient(bias, size)
    return sinks, bias


def _masks_aligned(causal, window):
    return bool(causal) or (window is not None and tuple(int(w) for w in window) != (-1, -1))


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, *, causal=False,
                     window=None, softcap=None, scale=None, sinks=None, dropout=0.0, dropout_seed=0,
                     impl="flash_attn2", flash_kernel="auto", deterministic=False, return_lse=False):
    """Attention of a packed variable-length batch, as FlashAttention's flash_attn_varlen_func takes it:
    q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv), cu_seqlens_q / cu_seqlens_k cumulative
    sequence lengths [0, l0, l0 + l1, ...] (int32 or int64 tensors, or lists). Sequence i's queries see
    sequence i's keys; causal and window align to the end of each sequence's keys. Returns o (total_q, Hq,
    Dv), and lse (Hq, total_q) (FlashAttention's varlen layout) with return_lse=True; differentiable as
    attention. max_seqlen_q / max_seqlen_k are checked (each at least the longest sequence) and not needed.

    impl="auto" chooses per call as attention's (flash_attn2 for the one call with segment ids). Runs as one call
    of batch 1 with segment ids (ringattn.varlen says when that is each sequence's own
    attention: always without causal / window, and for equal cu_seqlens_q and cu_seqlens_k); otherwise, and
    with impl="cudnn" (which takes no segment ids), one call a sequence (dropout then refused: each call
    would draw the same mask; cudnn's one-token sequences on flash_attn2, as cuDNN's backward takes none).
    The lengths are read on the host and checked by name. Where one call is sure without them (cu_seqlens_q is
    cu_seqlens_k, as in training, or neither causal nor a window) and they are tensors, that call is queued before
    they are read back and checked, so a GPU runs it while the host waits for them; a bad length still raises
    before anything is returned."""
    varlen.check_packed_tensors(q, k, v)
    options = dict(causal=causal, window=window, softcap=softcap, scale=scale, sinks=sinks, impl=impl,
                   flash_kernel=flash_kernel, deterministic=deterministic, return_lse=True)

    def one_call(q_ids, kv_ids):  # the packed batch as one call of batch 1 with segment ids
        o, lse = attention(q[None], k[None], v[None], segment_ids=q_ids, kv_segment_ids=kv_ids, dropout=dropout,
                           dropout_seed=dropout_seed, **options)
        return o[0], lse[0]

    one_call_sure = impl != "cudnn" and (cu_seqlens_q is cu_seqlens_k or not _masks_aligned(causal, window))
    if one_call_sure and all(isinstance(cu, torch.Tensor) and cu.device == q.device for cu in (cu_seqlens_q, cu_seqlens_k)):
        read_q = varlen.start_host_read(cu_seqlens_q, "cu_seqlens_q")
        read_k = read_q if cu_seqlens_k is cu_seqlens_q else varlen.start_host_read(cu_seqlens_k, "cu_seqlens_k")
        q_ids = varlen.segment_ids_of(cu_seqlens_q, q.shape[0])
        kv_ids = q_ids if cu_seqlens_k is cu_seqlens_q else varlen.segment_ids_of(cu_seqlens_k, k.shape[0])
        o, lse = one_call(q_ids, kv_ids)
        cu_q = read_q()
        varlen.packed_sequences(cu_q, cu_q if read_k is read_q else read_k(), q.shape[0], k.shape[0], max_seqlen_q,
                                max_seqlen_k)  # raises on a bad length
        return (o, lse) if return_lse else o
    packed = varlen.packed_sequences(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k,
                                     _masks_aligned(causal, window))
    if packed.one_call and impl != "cudnn":  # cuDNN takes no segment ids: a call a sequence
        q_ids = packed.segment_ids(q.device)
        o, lse = one_call(q_ids, q_ids if packed.cu_k == packed.cu_q else packed.segment_ids(q.device, keys=True))
    else:
        if dropout and impl != "cudnn":  # (cudnn refuses dropout itself, by name)
            raise ValueError("dropout with causal or window where sequences end at different distances between "
                             "cu_seqlens_k and cu_seqlens_q runs one call a sequence, each drawing the same mask: "
                             "not supported (pass dropout=0, or equal key and query lengths)")
        options.update(dropout=dropout, dropout_seed=dropout_seed)
        outputs, stats = [], []
        for i in range(len(packed.cu_q) - 1):
            lq, lk = packed.lengths(i)
            rows, keys = slice(packed.cu_q[i], packed.cu_q[i + 1]), slice(packed.cu_k[i], packed.cu_k[i + 1])
            if lq == 0:
                continue
            if lk == 0:  # queries that see no key: o = 0, and lse the sink's logit (-inf without sinks)
                outputs.append(q.new_zeros((lq, q.shape[1], v.shape[2])))
                stats.append(torch.full((q.shape[1], lq), -float("inf"), dtype=_stats_dtype(q), device=q.device)
                             if sinks is None else sinks.to(_stats_dtype(q))[:, None].expand(-1, lq))
                continue
            # A one-token sequence, whose backward cuDNN cannot take (s_q = s_kv = 1), on flash_attn2's kernels.
            single = impl in ("cudnn", "auto") and lq == lk == 1
            o_i, lse_i = attention(q[rows][None], k[keys][None], v[keys][None],
                                   **dict(options, impl="flash_attn2") if single else options)
            outputs.append(o_i[0])
            stats.append(lse_i[0])
        o, lse = torch.cat(outputs), torch.cat(stats, dim=1)
    return (o, lse) if return_lse else o


def ring_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, *, comm=None,
                          group=None, layout="zigzag", causal=False, window=None, softcap=None, scale=None, sinks=None,
                          dropout=0.0, dropout_seed=0, local_impl="flash_attn2", flash_kernel="auto", timeout=60.0,
                          deterministic=False, grad_wire="f32", return_lse=False):
    """Ring attention of a packed variable-length batch: q (rows of this rank, Hq, D), k, v this rank's shard
    (ringattn.shard(x, 0, layout, rank, size)) of the packed sequence that cu_seqlens_q / cu_seqlens_k (the
    whole batch's, the same on every rank) cut into sequences, as attention_varlen takes it. Returns this
    rank's rows of o, and lse (Hq, rows) with return_lse=True; differentiable as ring_attention.

    The ring runs one causal diagonal over the packed sequence: with causal or window, every sequence must
    end at the same distance between its keys and its queries (equal cu_seqlens_q and cu_seqlens_k, as in
    training), else a ValueError says which sequence does not."""
    try:
        varlen.check_packed_tensors(q, k, v)
        packed = varlen.packed_sequences(cu_seqlens_q, cu_seqlens_k, None, None, max_seqlen_q, max_seqlen_k,
                                         _masks_aligned(causal, window))
        if not packed.one_call:
            first, offset = packed.misaligned, packed.cu_k[-1] - packed.cu_q[-1]
            raise ValueError(f"sequence {first} ends {packed.cu_k[first + 1] - packed.cu_q[first + 1]} keys past its "
                             f"queries' end but the batch {offset}: the ring aligns causal and window once, over the "
                             "packed sequence (pass equal cu_seqlens_q and cu_seqlens_k, or use attention_varlen on "
                             "one process)")
        rank, size = varlen.rank_and_size(comm, group)
        segments = ringattn_shard(packed.segment_ids(q.device), 1, layout, rank, size)
        kv_segments = ringattn_shard(packed.segment_ids(q.device, keys=True), 1, layout, rank, size)
    except Exception as error:
        _refuse_ring_call(comm, group, timeout, q, error)
        raise
    o, lse = ring_attention(q[None], k[None], v[None], comm=comm, group=group, layout=layout,
                            global_q_len=packed.cu_q[-1], global_kv_len=packed.cu_k[-1], causal=causal, window=window,
                            softcap=softcap, scale=scale, sinks=sinks, segment_ids=segments, kv_segment_ids=kv_segments,
                            dropout=dropout, dropout_seed=dropout_seed, local_impl=local_impl,
                            flash_kernel=flash_kernel, timeout=timeout, deterministic=deterministic,
                            grad_wire=grad_wire, return_lse=True)
    return (o[0], lse[0]) if return_lse else o[0]
