"""ringattn for Hugging Face Transformers: `attn_implementation="ringattn"` and context-parallel training.

    import ringattn.hf
    ringattn.hf.register()                                   # this process's attention
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="ringattn")

    ringattn.hf.register("ringattn_ring", group=None, layout="zigzag")  # the ring over a process group
    ids, positions = ringattn.hf.shard_inputs(input_ids, rank, size)     # each rank's rows, and their positions
    model(input_ids=ids, position_ids=positions)                         # attention sees the whole sequence

The attention function takes what the models hand FlashAttention's: q (B, Hq, T, D), k / v (B, Hkv, S, D),
causal from the module, `scaling`, `dropout` (its mask drawn from torch's default generator, regenerated
exactly by the backward), `sliding_window` (W: the query and W - 1 keys before it, as the models' masks
and FlashAttention's window take it), `softcap` (Gemma 2), `s_aux` (gpt-oss's sinks, with their gradient),
`position_bias` (an additive (B|1, H, T, S) bias); GQA without repeating K / V. Masks stay compact: a
2-D padding mask (batch rows' pad keys hidden) or packed sequences (position_ids restarting, or
FlashAttention's cu_seq_lens_q / cu_seq_lens_k) become segment ids. A mask pattern beyond those (a
model's or_mask / and_mask overlays, chunked or blockwise attention) is built exactly by Transformers'
own sdpa_mask as a (B, 1, T, S) boolean mask: correct, T x S bytes, said once in a warning. A 4-D mask
or bias the caller passes is taken as given. Decoding takes dynamic and static KV caches: a static cache's
slots past a causal layer's last query are not yet written, and are left out. torch.compile traces a
model in one graph (PyTorch 2.15): tensors are never read while tracing, so packing and padding reach the
kernels as segment ids there (flash_attn2, never cudnn).

The ring runs each rank's shard (ringattn.shard's layouts; zigzag balances causal): the model is the same
on every rank, input_ids and position_ids are the rank's rows, and the loss of each rank's rows sums to
the whole sequence's, as the ranks' summed parameter gradients do (sinks' too). Padding (a 2-D mask of
the rank's rows) and packed sequences (global position_ids restarting, gathered once per forward) run
there too; patterns that need a T x S mask are refused by name.
"""

import sys
import types
from typing import Optional

import torch

from . import _core
from . import shard as ringattn_shard, unshard as ringattn_unshard
from . import torch as rt

__all__ = ["register", "shard_inputs", "attention_forward"]


_masking = []  # Transformers' masking_utils, imported once: torch.compile's tracing cannot import it (a lazy module)


def _masking_utils():
    if not _masking:
        try:
            from transformers import masking_utils
        except ImportError as error:  # the module is importable without Transformers; using it is not
            raise ImportError("ringattn.hf needs Hugging Face Transformers (pip install transformers)") from error
        _masking.append(masking_utils)
    return _masking[0]


# The mask factories whose pattern the attention function rebuilds from its own arguments (causal,
# sliding_window, segment ids): every other one (or_masks, chunked or blockwise overlays, a caller's
# function) has its mask built exactly.
_COMPACT_FACTORIES = {
    "causal_mask_function", "bidirectional_mask_function", "and_masks.<locals>.and_mask",
    "sliding_window_overlay.<locals>.inner_mask", "sliding_window_bidirectional_overlay.<locals>.inner_mask",
    "padding_mask_function.<locals>.inner_mask", "packed_sequence_mask_function.<locals>.inner_mask",
    "remap_positions_for_packed_sequence.<locals>.inner_mask", "add_offsets_to_mask_function.<locals>.inner_mask",
}


def _parts(mask_function) -> list:
    """mask_function and the mask functions it combines (and_masks' and the overlays' closures), depth first
    (a list: torch.compile's tracing of PyTorch 2.11 takes no generator)."""
    parts = [mask_function]
    if isinstance(mask_function, types.FunctionType):
        for cell in mask_function.__closure__ or ():
            contents = cell.cell_contents
            for inner in contents if isinstance(contents, tuple) else (contents,):
                if callable(inner) and not isinstance(inner, torch.Tensor):
                    parts += _parts(inner)
    return parts


_HAS_CO_QUALNAME = sys.version_info >= (3, 11)  # (read once: tracing cannot compare version_info)


def _qualname(function):
    """A function's qualified name, read as torch.compile's tracing can: its code's (a closure made while
    tracing reads None as __qualname__ there); None for other callables."""
    if not isinstance(function, types.FunctionType):
        return None
    return function.__code__.co_qualname if _HAS_CO_QUALNAME else function.__qualname__


def _compact(mask_function) -> bool:
    """Whether mask_function is built only of causal / bidirectional / sliding window / padding / packing."""
    for part in _parts(mask_function):
        if _qualname(part) not in _COMPACT_FACTORIES or part.__module__ != "transformers.masking_utils":
            return False
    return True


def _causal(mask_function) -> bool:
    return "causal_mask_function" in [_qualname(part) for part in _parts(mask_function)]


_warned, _warn_once = rt._warned, rt._warn_once  # one record of the warnings given


def _local_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
                **kwargs):
    """The mask function registered beside "ringattn": the 2-D padding mask (or None) where the attention
    function rebuilds the pattern, else Transformers' sdpa_mask (the exact (B, 1, T, S) boolean mask)."""
    masking = _masking_utils()
    if mask_function is None:  # (not `or`: torch.compile's tracing cannot take a function's truth)
        mask_function = masking.causal_mask_function
    if _compact(mask_function):
        # A static cache hands every slot, written or not: a causal layer's keys past its last query are
        # not yet written. A mask of the written columns tells attention_forward to drop the rest (as
        # FlashAttention's does). A bidirectional mask's keys (an encoder's, for cross-attention) are all keys.
        written = int(q_offset) + q_length - int(kv_offset)
        if attention_mask is None and written < kv_length and _causal(mask_function):
            attention_mask = torch.ones(batch_size, written, dtype=torch.bool, device=kwargs.get("device"))
        # The last kv_length columns (a sliding layer's), all true too: attention_forward reads them once a
        # forward eagerly, never while torch.compile traces (FlashAttention's mask function reads them there).
        return None if attention_mask is None else attention_mask[:, -kv_length:]
    _warn_once("dense", "ringattn.hf: this model's mask pattern (%s) is not one ringattn rebuilds from its options "
                        "(causal, sliding window, padding, packed sequences): it runs as a dense (B, 1, T, S) boolean "
                        "mask, exact but T x S bytes a batch row" % (_qualname(mask_function) or "?"))
    kwargs.pop("allow_is_causal_skip", None)
    return masking.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                             kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                             allow_is_causal_skip=False, **kwargs)


def _ring_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
               **kwargs):
    """The ring's mask function: a pattern the ring cannot take compactly is refused by name."""
    masking = _masking_utils()
    if mask_function is None:  # (not `or`: torch.compile's tracing cannot take a function's truth)
        mask_function = masking.causal_mask_function
    if not _compact(mask_function):
        raise ValueError("ringattn.hf's ring takes causal, sliding-window, padding and packed-sequence masks; this "
                         "model's mask (%s) needs a dense T x S mask, which the ring does not shard: use "
                         "attn_implementation='ringattn' on one process" % (_qualname(mask_function) or "?"))
    # The 2-D mask as given, all true too: every rank then passes segment ids to the ring, or none does.
    return None if attention_mask is None else attention_mask[:, -kv_length:]


def sequence_ids_of_positions(position_ids: torch.Tensor) -> Optional[torch.Tensor]:
    """Packed sequences' ids (B, T) int32 where position_ids restart (a step other than +1 begins a new
    sequence, as Transformers' find_packed_sequence_indices says), None where each row is one sequence."""
    step = torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1)
    ids = (step != 1).cumsum(-1, dtype=torch.int32)
    if torch.compiler.is_compiling():  # the ids without reading them: no graph break (nor cuDNN's steps)
        return ids
    return ids if bool(ids[:, -1].any()) else None


class _PerTensor:
    """fn(tensor, *args), remembered for the few tensors seen last while each is the same object, unchanged:
    every layer of a forward gets the same position_ids or mask, read (a device sync) by the first only."""

    def __init__(self, fn, slots=4):
        self.fn, self.slots, self.seen = fn, slots, []

    def __call__(self, tensor, *args):
        version = None if torch.compiler.is_compiling() else rt._version_of(tensor)
        if version is None:  # traced tensors are not the run's; an inference tensor's writes are not counted
            return self.fn(tensor, *args)
        for entry in self.seen:
            if entry[0] is tensor and entry[1] == version and entry[2] == args:
                return entry[3]
        result = self.fn(tensor, *args)
        self.seen = [(tensor, version, args, result)] + self.seen[:self.slots - 1]
        return result


_packed_sequence_ids = _PerTensor(lambda positions, batch: sequence_ids_of_positions(positions.expand(batch, -1)))


def _sequence_ids_of_cu_seqlens(cu, total, device, name):
    """Segment ids (1, total) from FlashAttention's cumulative lengths (its packed batch of one row)."""
    cu = torch.as_tensor(cu, device=device).long()
    checked = not torch.compiler.is_compiling()  # (eagerly: reading cu while tracing would break the graph)
    if checked and (cu.ndim != 1 or int(cu[0]) != 0 or int(cu[-1]) != total or bool((cu.diff() < 0).any())):
        raise ValueError("%s must run from 0 to the packed length %d without decreasing: got %s" %
                         (name, total, cu.tolist()))
    rows = torch.arange(total, device=device)
    return (torch.searchsorted(cu[1:], rows, right=True)).int()[None]


def _padding_ids(attention_mask: torch.Tensor, kv_length: int):
    """Key segment ids (B, S) from a 2-D padding mask of at least S columns: 0 where a key is seen, 1 where
    it is padding; the queries all take 0, so each query sees its row's real keys (as the models' masks say)."""
    valid = attention_mask[:, -kv_length:].bool()
    if torch.compiler.is_compiling():  # the ids without reading them, as sequence_ids_of_positions
        return (~valid).int()
    return None if bool(valid.all()) else (~valid).int()


_padding_ids_of = _PerTensor(_padding_ids)


def _dropout_seed(dropout: float) -> int:
    """A seed for this call's dropout mask from torch's default generator (torch.manual_seed makes a step
    reproducible); the backward regenerates the same mask from it."""
    return int(torch.randint(0, 2 ** 62, (), dtype=torch.int64)) if dropout else 0


def _window(sliding_window, causal):
    if sliding_window is None:
        return None
    w = int(sliding_window)
    if w < 1:
        raise ValueError("sliding_window must be at least 1 (the query's own key): got %d" % w)
    return (w - 1, 0 if causal else w - 1)


def _sinks(s_aux):
    return None if s_aux is None else s_aux.float()


def _options(module, dropout, scaling, is_causal, sliding_window, softcap, s_aux, output_attentions):
    """The ringattn options both hooks take from the model's arguments (each reads attention_mask itself)."""
    if output_attentions:
        _warn_once("weights", "ringattn.hf: attention weights are never formed (output_attentions=True returns None "
                              "for them); use attn_implementation='eager' to see them")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    return dict(causal=causal, window=_window(sliding_window, causal), softcap=softcap, scale=scaling,
                sinks=_sinks(s_aux), dropout=float(dropout or 0.0), dropout_seed=_dropout_seed(dropout))


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      sliding_window=None, softcap=None, s_aux=None, position_bias=None, position_ids=None,
                      cu_seq_lens_q=None, cu_seq_lens_k=None, output_attentions=False, impl="auto",
                      **kwargs):
    """The "ringattn" attention function (Transformers' AttentionInterface): (o (B, T, Hq, Dv), None)."""
    options = _options(module, dropout, scaling, is_causal, sliding_window, softcap, s_aux, output_attentions)
    T, S = query.shape[2], key.shape[2]
    bias = None if position_bias is None else position_bias.float()
    if attention_mask is None:
        if cu_seq_lens_q is not None or cu_seq_lens_k is not None:
            if query.shape[0] != 1:
                raise ValueError("cu_seq_lens_q / cu_seq_lens_k describe a packed batch of one row: q has %d rows" %
                                 query.shape[0])
            q_cu = cu_seq_lens_q if cu_seq_lens_q is not None else cu_seq_lens_k
            k_cu = cu_seq_lens_k if cu_seq_lens_k is not None else cu_seq_lens_q
            options.update(segment_ids=_sequence_ids_of_cu_seqlens(q_cu, T, query.device, "cu_seq_lens_q"),
                           kv_segment_ids=_sequence_ids_of_cu_seqlens(k_cu, S, query.device, "cu_seq_lens_k"))
        elif position_ids is not None and T == S and T > 1:
            ids = _packed_sequence_ids(position_ids, query.shape[0])
            if ids is not None:
                options.update(segment_ids=ids, kv_segment_ids=ids)
    elif attention_mask.ndim == 2:
        if attention_mask.shape[-1] < S:  # a static cache's written slots: the rest are not keys yet
            S = attention_mask.shape[-1]
            key, value = key[:, :, :S], value[:, :, :S]
            bias = None if bias is None else bias[..., :S]
        kv_ids = _padding_ids_of(attention_mask, S)
        if kv_ids is not None:
            options.update(segment_ids=kv_ids.new_zeros((query.shape[0], T)), kv_segment_ids=kv_ids)
    elif attention_mask.ndim == 4:  # a dense mask (ours, or the caller's): it holds the pattern, causal too
        options["causal"] = False
        if attention_mask.dtype == torch.bool:
            options["mask"] = attention_mask
        else:  # additive, as the models' eager masks are
            bias = attention_mask.float() if bias is None else bias + attention_mask.float()
    else:
        raise ValueError("attention_mask must be 2-D (batch, keys) padding or 4-D (batch, 1, queries, keys): got %d "
                         "dimensions %s" % (attention_mask.ndim, tuple(attention_mask.shape)))
    o = rt.attention(query, key, value, qkv_format="bhsd", bias=bias, impl=impl, **options)
    return o.transpose(1, 2), None  # (B, T, H, Dv), the models' layout: the core's own, no copy


class _Ring:
    """The "ringattn_ring" attention function: this rank's shard over the ring of `comm` or `group`."""

    def __init__(self, comm, group, layout, local_impl, ring_options):
        self.comm, self.group, self.layout, self.local_impl = comm, group, layout, local_impl
        self.ring_options = ring_options
        self.segment_ids = _PerTensor(self._segment_ids, slots=1)  # one gather a forward

    def rank_and_size(self):
        from .varlen import rank_and_size
        return rank_and_size(self.comm, self.group)

    def agreed_seed(self, seed: int, device: torch.device) -> int:
        """Rank 0's dropout seed on every rank: the ring's ranks must draw one mask, whatever their generators."""
        if self.comm is not None and hasattr(self.comm, "bcast"):  # mpi4py
            return int(self.comm.bcast(seed, root=0))
        if self.comm is not None:
            raise ValueError("dropout in ringattn.hf's ring needs an mpi4py comm or a torch.distributed group to agree "
                             "on its seed: %s has no bcast" % type(self.comm).__name__)
        import torch.distributed as dist
        value = torch.tensor([seed], dtype=torch.int64, device=device)  # (an NCCL group takes CUDA tensors)
        dist.broadcast(value, dist.get_global_rank(self.group, 0) if self.group is not None else 0, group=self.group)
        return int(value)

    def _gather(self, local: torch.Tensor):
        """Every rank's position_ids (B, T_local), in rank order."""
        if self.comm is not None and hasattr(self.comm, "allgather"):  # mpi4py
            return [torch.as_tensor(x) for x in self.comm.allgather(local.cpu().numpy())]
        import torch.distributed as dist
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, local.contiguous(), group=self.group)
        return parts

    def _segment_ids(self, position_ids: torch.Tensor, batch: int):
        """This rank's rows of the packed sequences' ids, from every rank's position_ids (None: no packing)."""
        rank, size = self.rank_and_size()
        local = position_ids.expand(batch, -1).to(torch.int64)
        parts = [p.to(local.device) for p in self._gather(local)]  # collective: every rank, every forward
        own = torch.arange(local.shape[1], device=local.device)
        if size > 1 and all(torch.equal(p, own.expand_as(p)) for p in parts):
            raise ValueError("every rank's position_ids are 0 .. %d, its own rows' count: the model made them, "
                             "where the ring needs each row's global position (pass position_ids from "
                             "ringattn.hf.shard_inputs)" % (local.shape[1] - 1))
        ids = sequence_ids_of_positions(ringattn_unshard(parts, 1, self.layout))
        return None if ids is None else ringattn_shard(ids, 1, self.layout, rank, size)

    def __call__(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                 sliding_window=None, softcap=None, s_aux=None, position_bias=None, position_ids=None,
                 output_attentions=False, **kwargs):
        options = _options(module, dropout, scaling, is_causal, sliding_window, softcap, s_aux, output_attentions)
        if options["dropout"]:
            options["dropout_seed"] = self.agreed_seed(options["dropout_seed"], query.device)
        if query.shape[2] != key.shape[2]:
            raise ValueError("ringattn.hf's ring runs training-shaped calls (each rank's queries and keys the same "
                             "rows): q has %d rows, k %d (a KV cache? generate with attn_implementation='ringattn')" %
                             (query.shape[2], key.shape[2]))
        for name, given in (("position_bias", position_bias), ("cu_seq_lens_q", kwargs.get("cu_seq_lens_q")),
                            ("cu_seq_lens_k", kwargs.get("cu_seq_lens_k"))):
            if given is not None:
                raise ValueError("ringattn.hf's ring does not take %s (its shard of the sequence would need the whole "
                                 "one): use position_ids restarting at each sequence for packing" % name)
        if attention_mask is not None and attention_mask.ndim != 2:
            raise ValueError("ringattn.hf's ring takes a 2-D padding mask of the rank's rows, not a %d-D mask %s" %
                             (attention_mask.ndim, tuple(attention_mask.shape)))
        if attention_mask is not None:  # segment ids whether or not this rank has padding: each rank passes them
            ids = (~attention_mask.bool()).int()
            options.update(segment_ids=ids.new_zeros(ids.shape), kv_segment_ids=ids)
        elif position_ids is not None:
            ids = self.segment_ids(position_ids, query.shape[0])
            if ids is not None:
                options.update(segment_ids=ids, kv_segment_ids=ids)
        o = rt.ring_attention(query, key, value, comm=self.comm, group=self.group, layout=self.layout,
                              local_impl=self.local_impl, qkv_format="bhsd", **options, **self.ring_options)
        return o.transpose(1, 2), None


def shard_inputs(input_ids: torch.Tensor, rank: int, size: int, layout: str = "zigzag", position_ids=None):
    """This rank's columns of input_ids (B, T) under `layout`, and its position_ids (the same columns of
    position_ids, default 0 .. T - 1): what each rank's model takes with "ringattn_ring". Labels and any
    per-token tensor are cut the same way: ringattn.shard(x, 1, layout, rank, size)."""
    if position_ids is None:
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
    return (ringattn_shard(input_ids, 1, layout, rank, size), ringattn_shard(position_ids, 1, layout, rank, size))


def register(name: str = "ringattn", *, ring: Optional[bool] = None, comm=None, group=None,
             layout: Optional[str] = None, impl: Optional[str] = None, local_impl: Optional[str] = None,
             **ring_options):
    """Register ringattn with Transformers' AttentionInterface (and its mask function with
    AttentionMaskInterface) as `name`, for attn_implementation=name; returns name.

    Without comm / group (ring=None or False): this process's attention, `impl` its kernel: "auto" (the
    default: cudnn for half-precision CUDA calls without segment ids, soft cap, window, sinks, dropout,
    bias or mask, flash_attn2 for the rest; on CUDA the sdpa where the flash kernels cannot run: f32, head
    dims), or flash_attn2, sdpa, blockwise (CPU), cudnn (CUDA). With
    `comm` (mpi4py or ringattn.NcclComm) or `group` (a torch.distributed group; ring=True for the default
    one): the ring over it, `layout` as ringattn.shard cuts the rows (zigzag, the default), `local_impl`
    each rank's kernel ("auto" as impl), and ring_attention's other options (timeout, deterministic,
    grad_wire). An option of the other kind is refused by name."""
    from transformers import AttentionInterface
    masking = _masking_utils()
    if "flash" in name:  # Transformers takes any such name for a FlashAttention build and loads one for it
        raise ValueError("name %r holds 'flash', which Transformers reserves for FlashAttention implementations "
                         "(it would try to load flash_attn for it): pick another name" % name)
    as_ring = ring if ring is not None else (comm is not None or group is not None)
    if not as_ring:
        ring_only = [n for n, v in (("comm", comm), ("group", group), ("layout", layout), ("local_impl", local_impl))
                     if v is not None] + sorted(ring_options)
        if ring_only:
            raise ValueError("%s appl%s to the ring (comm= or group=, or ring=True); register(%r) without them is one "
                             "process's attention" % (", ".join(ring_only), "ies" if len(ring_only) == 1 else "y",
                                                      name))

        def function(*args, **kwargs):
            return attention_forward(*args, impl=impl or "auto", **kwargs)
        mask = _local_mask
    else:
        if impl is not None:
            raise ValueError("impl applies to one process's attention; the ring's kernel is local_impl")
        layout = layout or "zigzag"
        _core.layout_indices(layout, 4, 2, 0)  # a bad layout name raises here, not in the first step
        function, mask = _Ring(comm, group, layout, local_impl or "auto", ring_options), _ring_mask
    AttentionInterface.register(name, function)
    masking.AttentionMaskInterface.register(name, mask)
    return name
