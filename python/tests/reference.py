"""An f64 numpy reference of ringattn's attention and its gradients, written from the definitions
(independent of the C++ code): logits = scale * q k^T, soft cap, + bias; hidden where causal (queries
aligned to the end of the keys), outside the window, masked or in another segment; a sink is one more
logit per head whose value row is zero; rows that see nothing give o = 0 and lse = -inf."""

import numpy as np


def _visible(B, H, T, S, causal, window, mask, seg_q, seg_k):
    qpos = np.arange(T)[:, None] + (S - T)
    kpos = np.arange(S)[None, :]
    vis = np.ones((B, H, T, S), dtype=bool)
    if causal:
        vis &= kpos <= qpos
    if window is not None:
        left, right = window
        if left >= 0:
            vis &= kpos >= qpos - left
        if right >= 0:
            vis &= kpos <= qpos + right
    if mask is not None:
        vis &= np.broadcast_to(mask != 0, (B, H, T, S))
    if seg_q is not None:
        vis &= seg_q[:, None, :, None] == seg_k[:, None, None, :]
    return vis


def forward(q, k, v, causal=False, window=None, softcap=0.0, scale=0.0, sinks=None, bias=None, mask=None,
            segment_ids=None, kv_segment_ids=None):
    """o (B, T, Hq, Dv), lse (B, Hq, T) and what the backward needs."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, T, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    kk, vv = np.repeat(k, H // Hkv, axis=2), np.repeat(v, H // Hkv, axis=2)
    scale = scale or 1.0 / np.sqrt(D)
    x = np.einsum("bthd,bshd->bhts", q, kk) * scale
    s = softcap * np.tanh(x / softcap) if softcap else x.copy()
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    seg_k = kv_segment_ids if kv_segment_ids is not None else segment_ids
    vis = _visible(B, H, T, S, causal, window, mask, segment_ids, seg_k)
    s = np.where(vis, s, -np.inf)
    m = s.max(axis=-1)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, dtype=np.float64)[None, :, None])
    m_safe = np.where(np.isfinite(m), m, 0.0)
    total = np.exp(s - m_safe[..., None]).sum(axis=-1)
    if sinks is not None:
        total = total + np.exp(np.asarray(sinks, dtype=np.float64)[None, :, None] - m_safe)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, np.log(total) + m_safe, -np.inf)
    lse_safe = np.where(np.isfinite(lse), lse, np.inf)
    p = np.exp(s - lse_safe[..., None])
    o = np.einsum("bhts,bshd->bthd", p, vv)
    return o, lse, dict(p=p, x=x, kk=kk, vv=vv, scale=scale, lse_safe=lse_safe)


def backward(q, k, v, do, causal=False, window=None, softcap=0.0, scale=0.0, sinks=None, bias=None, mask=None,
             segment_ids=None, kv_segment_ids=None, dlse=None):
    """(dq, dk, dv, dbias, dsinks) in f64 (dbias / dsinks None where not given); dlse (B, Hq, T): where the
    loss reads lse too (d lse / d logit = p)."""
    o, lse, c = forward(q, k, v, causal, window, softcap, scale, sinks, bias, mask, segment_ids, kv_segment_ids)
    q = np.asarray(q, dtype=np.float64)
    do = np.asarray(do, dtype=np.float64)
    H, Hkv = q.shape[2], np.asarray(k).shape[2]
    p = c["p"]
    delta = np.einsum("bthd,bthd->bht", do, o)
    if dlse is not None:
        delta = delta - np.asarray(dlse, dtype=np.float64)
    dp = np.einsum("bthd,bshd->bhts", do, c["vv"])
    ds = p * (dp - delta[..., None])  # d loss / d (final logit)
    dx = ds * (1.0 - np.tanh(c["x"] / softcap) ** 2) if softcap else ds
    dq = np.einsum("bhts,bshd->bthd", dx, c["kk"]) * c["scale"]
    dk_full = np.einsum("bhts,bthd->bshd", dx, q) * c["scale"]
    dv_full = np.einsum("bhts,bthd->bshd", p, do)
    B, S = dk_full.shape[0], dk_full.shape[1]
    dk = dk_full.reshape(B, S, Hkv, H // Hkv, -1).sum(axis=3)
    dv = dv_full.reshape(B, S, Hkv, H // Hkv, -1).sum(axis=3)
    dbias = None
    if bias is not None:
        shape = np.shape(bias)
        dbias = ds.sum(axis=tuple(i for i in range(4) if shape[i] == 1), keepdims=True)
    dsinks = None
    if sinks is not None:
        p_sink = np.exp(np.asarray(sinks, dtype=np.float64)[None, :, None] - c["lse_safe"])
        dsinks = -(p_sink * delta).sum(axis=(0, 2))
    return dq, dk, dv, dbias, dsinks
