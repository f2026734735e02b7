"""ringattn from Python: attention and its backward on one process's arrays.

Arrays cross into the C++ core through DLPack without copies (numpy, or PyTorch / JAX arrays on the
CPU in this version) and the results come back as arrays of the same framework. Shapes follow
PyTorch and the seeds: q (B, T, Hq, D), k (B, S, Hkv, D), v (B, S, Hkv, Dv).
"""

from . import _core

__all__ = ["attention", "attention_backward"]


def attention(q, k, v, **options):
    """o (B, T, Hq, Dv) = attention of q over k and v; with return_lse=True, (o, lse (B, Hq, T)).

    Options: impl ("flash_attn2", "sdpa", "blockwise"), causal, window=(left, right), softcap, scale,
    sinks (Hq,), bias and mask (B|1, Hq|1, T|1, S), segment_ids (B, T) and kv_segment_ids (B, S),
    dropout, dropout_seed, return_lse. Bad input raises ValueError naming the tensor and dimension.
    """
    return _core.attention(q, k, v, like=q, **options)


def attention_backward(q, k, v, o, lse, do, **options):
    """(dq, dk, dv[, dbias][, dsinks]) of attention(q, k, v, **options) given its o, lse and do = dLoss/do.

    The options must be the forward's; f32_gradients=True returns dq, dk, dv in float32.
    """
    return _core.attention_backward(q, k, v, o, lse, do, like=q, **options)
