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


def _heads_expanded(q, k, v, softmax_scale, dtype):
    """q, k, v in `dtype` with k and v repeated to q's heads (GQA), and the scale (default 1/sqrt(d))."""
    q, k, v = (np.asarray(x).astype(dtype) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[3])
    return q, np.repeat(k, group, axis=2), np.repeat(v, group, axis=2), softmax_scale


def attention_ref(q, k, v, causal=False, softmax_scale=None, dtype=np.float64):
    """Attention computed in `dtype` (float64 by default: the reference).

    Returns (out, lse): out (B, Lq, H, D) and lse (B, H, Lq), both in `dtype`.
    With dtype=float16 (or float32) it is the plain same-dtype implementation
    whose error bounds what a half-precision kernel may be allowed.
    """
    q, k, v, softmax_scale = _heads_expanded(q, k, v, softmax_scale, dtype)
    lq, lk = q.shape[1], k.shape[1]
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


def attention_ref_ieee(q, k, v, causal=False, softmax_scale=None):
    """float64 attention whose non-finite inputs propagate the IEEE way (NumPy, BSHD).

    Differs from attention_ref only where the data is not finite: attention_ref turns a
    row whose softmax denominator is NaN into zeros and LSE -inf (its `denom > 0` test),
    which is what a row with no visible key gets. Here:
      * a row that sees no key, or whose visible scores are all -inf, gives zeros, LSE -inf;
      * a NaN score among a row's visible keys (NaN in q, or in a visible k row) makes the
        row's output and LSE NaN; a +inf score makes them NaN (+inf - +inf);
      * scores of keys a row does not see (causal) never matter, whatever their value;
      * out = P V over every key, so NaN/Inf in a v row reaches out[:, i, :, d] for the rows
        i with P[i, j] > 0, and also (0 * NaN) for rows that do not see key j: callers
        treat those as unspecified.
    Returns (out, lse) in float64: (B, Lq, H, D), (B, H, Lq).
    """
    q, k, v, softmax_scale = _heads_expanded(q, k, v, softmax_scale, np.float64)
    lq, lk = q.shape[1], k.shape[1]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = np.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
        visible = causal_mask(lq, lk) if causal else np.ones((lq, lk), dtype=bool)
        s = np.where(visible[None, None], s, -np.inf)
        m = np.max(s, axis=-1, keepdims=True) if lk > 0 else np.full(s.shape[:-1] + (1,), -np.inf)
        empty = m == -np.inf  # no visible key, or every visible score is -inf
        m_ref = np.where(empty, 0.0, m)  # NaN and +inf stay and reach p
        p = np.exp(s - m_ref)
        denom = np.sum(p, axis=-1, keepdims=True)
        out = np.einsum("bhqk,bkhd->bqhd", np.where(empty, 0.0, p / np.where(empty, 1.0, denom)), v)
        lse = np.where(empty, -np.inf, np.log(denom) + m_ref)[..., 0]
    return out, lse


def torch_from_jax(x):
    """A torch copy of a JAX array's values. The array is waited for before torch reads it, and torch's
    copy is waited for before the DLPack view is released: once released, JAX may give the memory to its
    next array while torch's stream (which JAX does not know) has yet to read it. Either gap gave a wrong
    reference in the whole suite under xdist, where waveboost had read the right values
    (benchmarks/NOTES.md, "FP8 tests: the reference's hand-over from JAX")."""
    import torch

    view = torch.from_dlpack(x.block_until_ready())
    copy = view.clone()
    if copy.is_cuda:
        torch.cuda.current_stream(copy.device).synchronize()
    return copy


def pytest_in_child(test_file, keyword, env):
    """Runs the tests of `test_file` selected by `keyword` again in a child process whose environment
    adds `env` (for settings a process reads once, e.g. WAVEBOOST_WGMMA_PIPELINE), and asserts that
    some ran and none failed."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", os.path.abspath(test_file),
           "-k", keyword]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **env), timeout=900,
                          cwd=os.path.dirname(os.path.abspath(test_file)))
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and "failed" not in done.stdout, tail


def attention_ref_torch(q, k, v, causal, scale, dtype=None, max_score_bytes=1 << 28):
    """softmax(scale q k^T) v in `dtype` (float64 by default) on q's device; BSHD in and out; lse (B, H, Lq).

    With dtype=q.dtype it is the plain same-dtype implementation of the half-precision rule.
    Rows with no visible key get out 0 and LSE -inf. The query rows go in chunks whose score
    matrix stays under max_score_bytes, so that many test processes sharing one GPU fit.
    """
    import torch

    if dtype is None:
        dtype = torch.float64
    group = q.shape[2] // k.shape[2]
    qt = q.to(dtype).transpose(1, 2)
    kt = k.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2)
    vt = v.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2)
    lq, lk = q.shape[1], k.shape[1]
    per_row = max(1, qt.shape[0] * qt.shape[1] * lk * torch.finfo(dtype).bits // 8)
    chunk = max(1, min(lq, max_score_bytes // per_row))
    outs, lses = [], []
    for r0 in range(0, lq, chunk):
        s = (qt[:, :, r0:r0 + chunk] @ kt.transpose(-1, -2)) * scale
        if causal:
            i = torch.arange(r0, min(lq, r0 + chunk), device=q.device)[:, None]
            j = torch.arange(lk, device=q.device)[None, :]
            s = s.masked_fill(j > i + (lk - lq), float("-inf"))
        lses.append(torch.logsumexp(s.double(), dim=-1))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no visible key: p = 0
        outs.append(p @ vt)
    if not outs:  # no query rows
        return qt.new_zeros(qt.shape[:-1] + (vt.shape[-1],)).transpose(1, 2), qt.new_zeros(qt.shape[:-1]).double()
    return torch.cat(outs, dim=2).transpose(1, 2), torch.cat(lses, dim=2)


def attention_ref_rows_torch(q, k, v, rows, causal, scale, key_chunk=8192):
    """float64 reference for selected query rows only, streamed over key chunks (torch, q's device).

    For tensors too large for a full float64 reference: `rows` are absolute query indices
    (a LongTensor or list) into q's seqlen_q; the causal mask uses them, so the result is
    exactly rows `rows` of the full reference. Memory is O(B * H * len(rows) * key_chunk).
    Returns (out, lse): float64 (B, len(rows), H, D) and (B, H, len(rows)).
    """
    import torch

    dev = q.device
    rows = torch.as_tensor(rows, device=dev, dtype=torch.long)
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    group = h // hkv
    qr = q.index_select(1, rows).to(torch.float64).transpose(1, 2)  # (B, H, R, D)
    m = torch.full((b, h, rows.numel()), float("-inf"), dtype=torch.float64, device=dev)
    l = torch.zeros_like(m)
    acc = torch.zeros((b, h, rows.numel(), d), dtype=torch.float64, device=dev)
    for j0 in range(0, lk, key_chunk):
        j1 = min(lk, j0 + key_chunk)
        kc = k[:, j0:j1].to(torch.float64).repeat_interleave(group, dim=2).transpose(1, 2)  # (B, H, C, D)
        vc = v[:, j0:j1].to(torch.float64).repeat_interleave(group, dim=2).transpose(1, 2)
        s = (qr @ kc.transpose(-1, -2)) * scale  # (B, H, R, C)
        if causal:
            keys = torch.arange(j0, j1, device=dev)[None, :]
            s = s.masked_fill(keys > rows[:, None] + (lk - lq), float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_ref = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_ref)
        p = torch.exp(s - m_ref[..., None])
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ vc
        m = m_new
    seen = l > 0
    out = torch.where(seen[..., None], acc / torch.where(seen, l, torch.ones_like(l))[..., None], torch.zeros_like(acc))
    lse = torch.where(seen, torch.log(torch.where(seen, l, torch.ones_like(l))) + m, torch.full_like(m, float("-inf")))
    return out.transpose(1, 2), lse


def rounding_error_bound(q, k, v, causal=False, softmax_scale=None, u_scores=2.0**-24, u_store=2.0**-24,
                         return_score_scale=False):
    # Storage types with a narrow exponent range (fp16) round tiny P and O values with an absolute
    # error of half the subnormal spacing rather than a relative one.
    """Elementwise bound (B, Lq, H, D) on |out - exact| for a correct float kernel (NumPy or torch).

    First-order forward error analysis of softmax(scale q k^T) v, worst case (Higham's gamma_n):
      * a score q.k summed in a precision of unit roundoff u_scores has |error| <= (d + 4) u_scores S_i,
        S_i = max_j scale * sum_d |q_id k_jd| over the keys row i sees (plus the rounding of the scale);
      * a score error moves out_i by at most max_j|ds_ij| * W_id, W_id = sum_j p_ij |v_jd - out_id|;
      * summing P V and the row sum over Lk keys adds at most (Lk + 4) u_scores M_id, and rounding P and
        O to storage (unit roundoff u_store) at most 4 u_store M_id (a factor 2 over once each),
        M_id = sum_j p_ij |v_jd| + |out_id|; for fp16 storage (u_store = 2^-11), P and O values below the
        smallest normal round with an absolute error up to 2^-25: (Lk + 1) 2^-25 max_j |v_jd| more.
    Near-ties (large W) get a large bound, one-hot rows a tight one; a wrong, overflowed or misread
    result is far outside it. Works on float64 copies of NumPy arrays or torch tensors (on their device).
    With return_score_scale, also returns S (B, H, Lq), which bounds LSE errors the same way.
    """
    is_np = isinstance(q, np.ndarray)
    if is_np:
        xp_abs, f64 = np.abs, (lambda x: np.asarray(x, np.float64))
    else:
        import torch

        xp_abs, f64 = torch.abs, (lambda x: x.to(torch.float64))
    q, k, v = f64(q), f64(k), f64(v)
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    group = h // hkv if hkv else 1
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    bound = np.zeros((b, lq, h, d)) if is_np else q.new_zeros((b, lq, h, d))
    score_scale = np.zeros((b, h, lq)) if is_np else q.new_zeros((b, h, lq))
    if lk == 0 or lq == 0:
        return (bound, score_scale) if return_score_scale else bound
    mask = causal_mask(lq, lk) if causal else np.ones((lq, lk), dtype=bool)
    if not is_np:
        import torch

        mask = torch.as_tensor(mask, device=q.device)
    for bi in range(b):
        for hi in range(h):
            qh, kh, vh = q[bi, :, hi], k[bi, :, hi // group], v[bi, :, hi // group]  # (Lq, D), (Lk, D)
            s = (qh @ kh.T) * softmax_scale
            a = (xp_abs(qh) @ xp_abs(kh).T) * abs(softmax_scale)
            if is_np:
                s = np.where(mask, s, -np.inf)
                s_i = np.where(mask, a, 0).max(-1)
                m = s.max(-1, keepdims=True)
                m = np.where(np.isfinite(m), m, 0)
                p = np.where(mask, np.exp(s - m), 0)
                den = p.sum(-1, keepdims=True)
                p = p / np.where(den > 0, den, 1)
                out = p @ vh
                w = np.einsum("qk,qkd->qd", p, np.abs(vh[None, :, :] - out[:, None, :]))
            else:
                s = s.masked_fill(~mask, float("-inf"))
                s_i = a.masked_fill(~mask, 0).amax(-1)
                m = s.amax(-1, keepdim=True)
                m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
                p = torch.exp(s - m).masked_fill(~mask, 0)
                den = p.sum(-1, keepdim=True)
                p = p / torch.where(den > 0, den, torch.ones_like(den))
                out = p @ vh
                w = torch.einsum("qk,qkd->qd", p, (vh[None, :, :] - out[:, None, :]).abs())
            big_m = p @ xp_abs(vh) + xp_abs(out)
            bound[bi, :, hi] = (d + 4) * u_scores * s_i[:, None] * w + ((lk + 4) * u_scores + 4 * u_store) * big_m
            if u_store == 2.0**-11:  # fp16 subnormals
                bound[bi, :, hi] += (lk + 1) * 2.0**-25 * (np.abs(vh).max(0) if is_np else vh.abs().amax(0))[None, :]
            score_scale[bi, hi] = s_i
    return (bound, score_scale) if return_score_scale else bound


def attention_backward_ref(dout, q, k, v, causal=False, softmax_scale=None, dlse=None, dtype=np.float64):
    """Gradients of attention (dq, dk, dv) by the explicit formulas, computed in `dtype` (NumPy, BSHD).

    With P the softmax of S = scale q k^T (masked entries 0, rows that see no key all 0), O = P V
    and D_i = sum_d dO_id O_id:
        dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D + dlse),  dQ = scale dS K,  dK = scale dS^T Q,
    where dlse (B, H, Lq), the gradient flowing into lse, is 0 when not given. dk and dv of a kv
    head sum over the query heads that read it (GQA). Returns (dq, dk, dv) in `dtype`.
    """
    dout = np.asarray(dout).astype(dtype)
    b, lq, h, d = np.shape(q)
    lk, hkv = np.shape(k)[1], np.shape(k)[2]
    group = h // hkv if hkv else 1
    q_, k_, v_, softmax_scale = _heads_expanded(q, k, v, softmax_scale, dtype)
    scale = dtype(softmax_scale)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = np.einsum("bqhd,bkhd->bhqk", q_, k_).astype(dtype) * scale
        if causal:
            s = np.where(causal_mask(lq, lk)[None, None], s, -np.inf)
        m = np.max(s, axis=-1, keepdims=True) if lk > 0 else np.full(s.shape[:-1] + (1,), -np.inf, dtype)
        m_safe = np.where(np.isfinite(m), m, 0)
        p = np.exp(s - m_safe)
        denom = np.sum(p, axis=-1, keepdims=True)
        p = np.where(denom > 0, p / np.where(denom > 0, denom, 1), 0).astype(dtype)
    out = np.einsum("bhqk,bkhd->bqhd", p, v_).astype(dtype)
    delta = np.einsum("bqhd,bqhd->bhq", dout, out).astype(dtype)
    dv_full = np.einsum("bhqk,bqhd->bkhd", p, dout).astype(dtype)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, v_).astype(dtype)
    shift = delta if dlse is None else delta - np.asarray(dlse).astype(dtype)
    ds = (p * (dp - shift[..., None])).astype(dtype)
    dq = (np.einsum("bhqk,bkhd->bqhd", ds, k_) * scale).astype(dtype)
    dk_full = (np.einsum("bhqk,bqhd->bkhd", ds, q_) * scale).astype(dtype)
    dk = dk_full.reshape(b, lk, hkv, group, d).sum(axis=3).astype(dtype)
    dv = dv_full.reshape(b, lk, hkv, group, d).sum(axis=3).astype(dtype)
    return dq, dk, dv
# ---------------------------------------------------------------------------
# Serving layouts: packed variable-length batches, paged KV caches, merged partial states.
# ---------------------------------------------------------------------------


def cu_seqlens(lengths) -> np.ndarray:
    """int32 (batch + 1,) offsets of packed sequences of the given lengths."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def attention_varlen_ref(q, k, v, cu_q, cu_k, causal=False, softmax_scale=None, seqused_k=None):
    """float64 attention per packed sequence: q (total_q, H, D), k/v (total_k, Hkv, D).

    Sequence b attends with its queries q[cu_q[b]:cu_q[b+1]] to its keys
    k[cu_k[b]:cu_k[b]+n] where n = seqused_k[b] if given, else cu_k[b+1]-cu_k[b];
    causal is bottom-right per sequence. Returns out (total_q, H, D) and lse (H, total_q),
    NaN on rows past cu_q[-1].
    """
    total_q, heads, head_dim = q.shape
    out = np.full((total_q, heads, head_dim), np.nan)
    lse = np.full((heads, total_q), np.nan)
    for b in range(len(cu_q) - 1):
        q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
        k0 = int(cu_k[b])
        k1 = k0 + int(seqused_k[b]) if seqused_k is not None else int(cu_k[b + 1])
        o, l = attention_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal,
                             softmax_scale=softmax_scale)
        out[q0:q1] = o[0]
        lse[:, q0:q1] = l[0]
    return out, lse


def paged_from_contiguous(rng, cache, page_size, spare_pages=3):
    """A paged copy of a contiguous cache (batch, max_len, Hkv, D), max_len a multiple of page_size.

    Pages are shuffled over a pool with `spare_pages` extra pages filled with random values, so
    a kernel reading the wrong page gets wrong numbers. Returns (pages, block_table int32).
    """
    batch, max_len, heads_kv, head_dim = cache.shape
    assert max_len % page_size == 0
    per_seq = max_len // page_size
    num_pages = batch * per_seq + spare_pages
    pages = rng.standard_normal((num_pages, page_size, heads_kv, head_dim)).astype(cache.dtype)
    ids = rng.permutation(num_pages)[: batch * per_seq].reshape(batch, per_seq).astype(np.int32)
    for b in range(batch):
        for i in range(per_seq):
            pages[ids[b, i]] = cache[b, i * page_size:(i + 1) * page_size]
    return pages, ids


def merge_states_ref(outs, lses):
    """float64 merge of partial attention states: outs (P, B, L, H, D), lses (P, B, H, L).

    Parts with LSE -inf contribute nothing; rows where every part is -inf give zeros, -inf.
    Returns (out (B, L, H, D), lse (B, H, L)).
    """
    outs = np.asarray(outs, dtype=np.float64)
    lses = np.asarray(lses, dtype=np.float64)
    m = np.max(lses, axis=0)
    empty = m == -np.inf
    m_safe = np.where(empty, 0.0, m)
    w = np.exp(lses - m_safe[None])  # (P, B, H, L); 0 for -inf parts
    total = np.sum(w, axis=0)
    w_bl = np.transpose(w, (0, 1, 3, 2))[..., None]  # (P, B, L, H, 1)
    safe_outs = np.where(w_bl > 0, outs, 0.0)  # a part with weight 0 may hold anything
    out = np.sum(w_bl * safe_outs, axis=0) / np.where(empty, 1.0, total).transpose(0, 2, 1)[..., None]
    lse = np.where(empty, -np.inf, m_safe + np.log(np.where(empty, 1.0, total)))
    return out, lse
