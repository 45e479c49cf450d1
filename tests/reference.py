"""Reference implementations every test compares against (one module, one truth).

All functions take BSHD arrays (batch, seqlen, heads, head_dim) as NumPy arrays
and follow waveboost's conventions: GQA maps query head h to kv head
h // (heads // heads_kv); the causal mask is bottom-right aligned; a query row
that sees no key has output 0 and LSE -inf.
"""

from __future__ import annotations

import math

import numpy as np


def causal_mask(seqlen_q: int, seqlen_k: int) -> np.ndarray:
    """Boolean (seqlen_q, seqlen_k): True where query i may see key j."""
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    return j <= i + (seqlen_k - seqlen_q)


def attention_ref(q, k, v, causal=False, softmax_scale=None, dtype=np.float64):
    """Attention computed in `dtype` (float64 by default: the reference).

    Returns (out, lse): out (B, Lq, H, D) and lse (B, H, Lq), both in `dtype`.
    With dtype=float16 (or float32) it is the plain same-dtype implementation
    whose error bounds what a half-precision kernel may be allowed.
    """
    q = np.asarray(q).astype(dtype)
    k = np.asarray(k).astype(dtype)
    v = np.asarray(v).astype(dtype)
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    group = h // hkv
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    k = np.repeat(k, group, axis=2)
    v = np.repeat(v, group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k).astype(dtype) * dtype(softmax_scale)
    if causal:
        s = np.where(causal_mask(lq, lk)[None, None], s, -np.inf)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(s, axis=-1, keepdims=True) if lk > 0 else np.full(s.shape[:-1] + (1,), -np.inf, dtype)
        m_safe = np.where(np.isfinite(m), m, 0)
        p = np.exp(s - m_safe)
        denom = np.sum(p, axis=-1, keepdims=True)
        lse = (np.log(denom) + m_safe)[..., 0]
        lse = np.where(denom[..., 0] > 0, lse, -np.inf).astype(dtype)
        p = np.where(denom > 0, p / np.where(denom > 0, denom, 1), 0).astype(dtype)
    out = np.einsum("bhqk,bkhd->bqhd", p, v).astype(dtype)
    return out, lse


def max_abs_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)))


def rel_err(a, ref) -> float:
    """||a - ref|| / ||ref|| (Frobenius); 0 when both are empty or ref is zero and a matches."""
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    num = np.linalg.norm((a - ref).ravel())
    den = np.linalg.norm(ref.ravel())
    return float(num / den) if den > 0 else float(num)


def random_qkv(rng, batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype=np.float32):
    """Fresh random normal inputs (never zeros)."""
    q = rng.standard_normal((batch, seqlen_q, heads, head_dim)).astype(dtype)
    k = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(dtype)
    v = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(dtype)
    return q, k, v
