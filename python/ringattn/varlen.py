"""Packed variable-length batches as FlashAttention's varlen functions take them: the sequences of a batch
laid end to end, q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv), and cumulative lengths
cu_seqlens_q / cu_seqlens_k = [0, l0, l0 + l1, ...] (one more entry than sequences). Sequence i's
queries attend to sequence i's keys only; causal and window are aligned to the end of each sequence's
keys, as FlashAttention's (and ringattn's) are to the end of a call's keys.

ringattn runs such a batch as one call of batch 1 with segment ids (every sequence a segment). Causal and
window masks are then aligned once, to the end of the packed keys: that is each sequence's own alignment
when every sequence ends as far into the keys as into the queries, plus the same constant (equal
cu_seqlens_q and cu_seqlens_k, as in training, always). Where they end differently (a sequence with more
cached keys than another), ringattn.torch.attention_varlen runs one call a sequence."""

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class PackedSequences:
    cu_q: list  # cumulative query lengths, host ints
    cu_k: list
    misaligned: Optional[int]  # with causal / window: the first sequence the packed call would misalign

    @property
    def one_call(self):
        """Whether one call of batch 1 with segment ids is each sequence's own attention."""
        return self.misaligned is None

    def lengths(self, i):
        return self.cu_q[i + 1] - self.cu_q[i], self.cu_k[i + 1] - self.cu_k[i]

    def segment_ids(self, device, keys=False):
        """(1, total) int32: each token's sequence index, on `device`."""
        cu = self.cu_k if keys else self.cu_q
        return segment_ids_of(torch.tensor(cu, dtype=torch.int64, device=device), cu[-1])


def segment_ids_of(cu, total):
    """(1, total) int32 on cu's device: each token's sequence index, from the cumulative lengths cu (a tensor)
    without a synchronisation (repeat_interleave on a GPU reads its output's size back: 0.17 ms a call,
    measured). Any cu gives ids in range, so a call may run on them before cu is checked."""
    tokens = torch.arange(total, dtype=torch.int64, device=cu.device)
    return torch.searchsorted(cu[1:].to(torch.int64), tokens, right=True).to(torch.int32)[None]


def _check_integer_tensor(cu, name):
    if cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers (int32 or int64), not {cu.dtype}")
    if cu.dim() != 1:
        raise ValueError(f"{name} must be 1-dimensional (number of sequences + 1), not of shape {tuple(cu.shape)}")


def start_host_read(cu, name):
    """Starts reading the cumulative lengths tensor cu back to the host (behind the work queued on its GPU's
    stream so far); returns the function that waits for them and gives them as ints."""
    _check_integer_tensor(cu, name)
    if not cu.is_cuda:
        return lambda: [int(x) for x in cu.tolist()]
    host = torch.empty(cu.shape, dtype=cu.dtype, pin_memory=True)
    host.copy_(cu, non_blocking=True)
    landed = torch.cuda.Event()
    landed.record()

    def wait():
        landed.synchronize()
        return [int(x) for x in host.tolist()]

    return wait


def _host_ints(cu, name):
    if isinstance(cu, torch.Tensor):
        _check_integer_tensor(cu, name)
        return [int(x) for x in cu.tolist()]
    values = list(cu)
    if not all(isinstance(x, int) or (hasattr(x, "__index__") and not isinstance(x, bool)) for x in values):
        raise ValueError(f"{name} must hold integers")
    return [int(x) for x in values]


def _checked_cumulative(cu, name, total, total_name):
    if len(cu) < 2:
        raise ValueError(f"{name} must have at least 2 entries (0 and the total length), not {len(cu)}")
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, not {cu[0]}")
    for i in range(1, len(cu)):
        if cu[i] < cu[i - 1]:
            raise ValueError(f"{name} must be non-decreasing: entry {i} is {cu[i]} after {cu[i - 1]}")
    if total is not None and cu[-1] != total:
        raise ValueError(f"{name} ends at {cu[-1]}, but {total_name} holds {total} tokens")


def _check_max(max_seqlen, cu, name, cu_name):
    if max_seqlen is None:
        return
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    if int(max_seqlen) < longest:
        raise ValueError(f"{name} is {int(max_seqlen)}, below the longest sequence of {cu_name} ({longest} tokens)")


def packed_sequences(cu_seqlens_q, cu_seqlens_k, total_q: Optional[int], total_k: Optional[int],
                     max_seqlen_q=None, max_seqlen_k=None, aligned_masks=False) -> PackedSequences:
    """The checked lengths of a packed batch. total_q / total_k: the tokens q / k hold (None: not checked
    here, as for a ring's shard). aligned_masks: whether causal or a window is asked for (the one call then
    needs every sequence to end at the same distance between keys and queries)."""
    cu_q, cu_k = _host_ints(cu_seqlens_q, "cu_seqlens_q"), _host_ints(cu_seqlens_k, "cu_seqlens_k")
    _checked_cumulative(cu_q, "cu_seqlens_q", total_q, "q's first dimension")
    _checked_cumulative(cu_k, "cu_seqlens_k", total_k, "k's first dimension")
    if len(cu_q) != len(cu_k):
        raise ValueError(f"cu_seqlens_q has {len(cu_q) - 1} sequences but cu_seqlens_k {len(cu_k) - 1}: "
                         "each sequence needs its queries and its keys")
    _check_max(max_seqlen_q, cu_q, "max_seqlen_q", "cu_seqlens_q")
    _check_max(max_seqlen_k, cu_k, "max_seqlen_k", "cu_seqlens_k")
    # Sequence i's query at row r (global row cu_q[i] + r) sits at key position cu_k[i+1] - lq + r in its
    # own alignment, and at cu_q[i] + r + (total_k - total_q) in the packed call's: equal for all its rows
    # iff cu_k[i+1] - cu_q[i+1] == total_k - total_q. Sequences with no queries or no keys place nothing.
    offset = cu_k[-1] - cu_q[-1]
    misaligned = next((i for i in range(len(cu_q) - 1) if cu_q[i + 1] > cu_q[i] and cu_k[i + 1] > cu_k[i]
                       and cu_k[i + 1] - cu_q[i + 1] != offset), None) if aligned_masks else None
    return PackedSequences(cu_q, cu_k, misaligned)


def check_packed_tensors(q, k, v):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 3:
            raise ValueError(f"{name} must be (total tokens, heads, head dim) as varlen functions take it; "
                             f"it has shape {tuple(x.shape)}")


def rank_and_size(comm, group):
    """This process's rank and the ring's size, of an mpi4py communicator, a ringattn.NcclComm or a
    torch.distributed group (None: the default one)."""
    if comm is not None:
        rank, size = getattr(comm, "rank", None), getattr(comm, "size", None)
        if callable(getattr(comm, "Get_rank", None)):
            rank, size = comm.Get_rank(), comm.Get_size()
        if rank is None or size is None:
            raise ValueError(f"comm ({type(comm).__name__}) has no rank and size: pass an mpi4py communicator "
                             "or a ringattn.NcclComm")
        return int(rank), int(size)
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialized (call init_process_group first)")
    return dist.get_rank(group), dist.get_world_size(group)
