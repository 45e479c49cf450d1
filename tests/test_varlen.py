"""waveboost.attention_varlen: packed variable-length batches and paged K/V, against per-sequence
float64 references (tests/reference.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import waveboost
from reference import attention_varlen_ref, cu_seqlens, paged_from_contiguous, rel_err

TOL = {np.float32: 1e-5, np.float64: 1e-12}
CUDA_BACKENDS = tuple(b for b in waveboost.BACKENDS if b != "cpu")


def _lengths(rng, batch, long_len):
    """Random short lengths with 0 and 1 among them and one long sequence."""
    lengths = list(rng.integers(0, 12, size=batch))
    lengths[0] = 0
    lengths[1] = 1
    lengths[int(rng.integers(2, batch))] = long_len
    return np.array(lengths)


def _packed(rng, total, heads, head_dim, dtype):
    return rng.standard_normal((total, heads, head_dim)).astype(dtype)


def _check(out, lse, ref, ref_lse, dtype, rows):
    out, lse = np.asarray(out), np.asarray(lse)
    assert not np.isnan(out[:rows]).any(), "unwritten (NaN-poisoned) or NaN output rows"
    assert rel_err(out[:rows], ref[:rows]) < TOL[dtype]
    assert np.array_equal(np.isneginf(lse[:, :rows]), np.isneginf(ref_lse[:, :rows])), "LSE -inf rows differ"
    finite = np.isfinite(ref_lse[:, :rows])
    np.testing.assert_allclose(lse[:, :rows][finite], ref_lse[:, :rows][finite], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads,heads_kv,head_dim", [(4, 4, 64), (8, 2, 37), (8, 1, 128)])
def test_varlen_matches_per_sequence_reference(rng, dtype, causal, heads, heads_kv, head_dim):
    batch = 7
    lq = _lengths(rng, batch, 257)
    lk = _lengths(rng, batch, 300)  # independent of lq: Lq > Lk (causal rows with no key) and Lq < Lk
    cu_q, cu_k = cu_seqlens(lq), cu_seqlens(lk)
    q = _packed(rng, cu_q[-1], heads, head_dim, dtype)
    k = _packed(rng, cu_k[-1], heads_kv, head_dim, dtype)
    v = _packed(rng, cu_k[-1], heads_kv, head_dim, dtype)
    out = np.full_like(q, np.nan)
    res, lse = waveboost.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, out=out, return_lse=True)
    assert res is out and lse.shape == (heads, cu_q[-1]) and lse.dtype == np.float32
    ref, ref_lse = attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal)
    _check(out, lse, ref, ref_lse, dtype, cu_q[-1])


def test_varlen_equals_dense_on_equal_lengths(rng):
    b, lq, lk, h, d = 3, 97, 130, 4, 64
    q = rng.standard_normal((b, lq, h, d)).astype(np.float32)
    k = rng.standard_normal((b, lk, 2, d)).astype(np.float32)
    v = rng.standard_normal((b, lk, 2, d)).astype(np.float32)
    dense, dense_lse = waveboost.attention(q, k, v, causal=True, return_lse=True)
    out, lse = waveboost.attention_varlen(
        q.reshape(b * lq, h, d), k.reshape(b * lk, 2, d), v.reshape(b * lk, 2, d),
        cu_seqlens([lq] * b), cu_seqlens([lk] * b), max_seqlen_q=lq, max_seqlen_k=lk, causal=True, return_lse=True)
    # Same kernel, same per-sequence work: bitwise equal.
    np.testing.assert_array_equal(out.reshape(b, lq, h, d), dense)
    np.testing.assert_array_equal(lse.reshape(h, b, lq).transpose(1, 0, 2), dense_lse)


def test_max_seqlen_given_or_omitted_agree(rng):
    lq, lk = np.array([3, 0, 9]), np.array([5, 4, 1])
    q, k, v = (_packed(rng, n, 2, 16, np.float64) for n in (12, 10, 10))
    a = waveboost.attention_varlen(q, k, v, cu_seqlens(lq), cu_seqlens(lk))
    b = waveboost.attention_varlen(q, k, v, cu_seqlens(lq), cu_seqlens(lk), max_seqlen_q=20, max_seqlen_k=30)
    np.testing.assert_array_equal(a, b)


def test_seqused_k_limits_keys(rng):
    lq, lk = np.array([4, 1, 6]), np.array([10, 7, 12])
    used = np.array([3, 0, 12], dtype=np.int32)
    cu_q, cu_k = cu_seqlens(lq), cu_seqlens(lk)
    q = _packed(rng, cu_q[-1], 4, 32, np.float64)
    k, v = _packed(rng, cu_k[-1], 2, 32, np.float64), _packed(rng, cu_k[-1], 2, 32, np.float64)
    out, lse = waveboost.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=used, causal=True, return_lse=True)
    ref, ref_lse = attention_varlen_ref(q, k, v, cu_q, cu_k, causal=True, seqused_k=used)
    _check(out, lse, ref, ref_lse, np.float64, cu_q[-1])


@pytest.mark.parametrize("page_size", [1, 5, 16, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_paged_matches_contiguous(rng, page_size, causal):
    # Chunked prefill on a paged cache: each sequence's new queries against its cached keys.
    batch, heads, heads_kv, head_dim = 4, 8, 2, 64
    max_len = page_size * max(1, -(-200 // page_size))
    cache_k = rng.standard_normal((batch, max_len, heads_kv, head_dim)).astype(np.float32)
    cache_v = rng.standard_normal((batch, max_len, heads_kv, head_dim)).astype(np.float32)
    used = np.array([0, 1, max_len, 77], dtype=np.int32)
    lq = np.array([3, 1, 9, 77])
    cu_q = cu_seqlens(lq)
    q = _packed(rng, cu_q[-1], heads, head_dim, np.float32)
    k_pages, table = paged_from_contiguous(rng, cache_k, page_size)
    v_pages = np.empty_like(k_pages)
    v_pages[:] = rng.standard_normal(v_pages.shape)
    for b in range(batch):
        for i in range(table.shape[1]):
            v_pages[table[b, i]] = cache_v[b, i * page_size:(i + 1) * page_size]
    out = np.full_like(q, np.nan)
    _, lse = waveboost.attention_varlen(q, k_pages, v_pages, cu_q, None, block_table=table, seqused_k=used,
                                        causal=causal, out=out, return_lse=True)
    flat_k = cache_k.reshape(batch * max_len, heads_kv, head_dim)
    flat_v = cache_v.reshape(batch * max_len, heads_kv, head_dim)
    ref, ref_lse = attention_varlen_ref(q, flat_k, flat_v, cu_q, np.arange(batch + 1) * max_len, causal=causal,
                                        seqused_k=used)
    _check(out, lse, ref, ref_lse, np.float32, cu_q[-1])


def test_paged_lengths_from_cu_seqlens_k(rng):
    # flash-attn's paged varlen form: cu_seqlens_k gives the lengths, block_table the pages.
    page_size, batch = 4, 3
    cache = rng.standard_normal((batch, 12, 1, 8))
    pages, table = paged_from_contiguous(rng, cache, page_size)
    lk = np.array([5, 12, 2])
    q = _packed(rng, 6, 2, 8, np.float64)
    cu_q = cu_seqlens([2, 2, 2])
    a = waveboost.attention_varlen(q, pages, pages, cu_q, cu_seqlens(lk), block_table=table)
    b = waveboost.attention_varlen(q, pages, pages, cu_q, None, block_table=table, seqused_k=lk.astype(np.int32))
    np.testing.assert_array_equal(a, b)
    ref, _ = attention_varlen_ref(q, cache.reshape(36, 1, 8), cache.reshape(36, 1, 8), cu_q, [0, 12, 24, 36],
                                  seqused_k=lk)
    assert rel_err(a, ref) < 1e-12


def test_torch_and_jax_inputs(rng):
    torch = pytest.importorskip("torch")
    lq, lk = np.array([2, 5]), np.array([3, 9])
    cu_q, cu_k = cu_seqlens(lq), cu_seqlens(lk)
    q, k, v = _packed(rng, 7, 4, 16, np.float32), _packed(rng, 12, 4, 16, np.float32), _packed(rng, 12, 4, 16, np.float32)
    ref = waveboost.attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    t = waveboost.attention_varlen(*(torch.from_numpy(x) for x in (q, k, v, cu_q, cu_k)), causal=True)
    assert isinstance(t, torch.Tensor)
    np.testing.assert_array_equal(t.numpy(), ref)
    jax = pytest.importorskip("jax")
    with jax.default_device(jax.devices("cpu")[0]):
        j = waveboost.attention_varlen(*(jax.numpy.asarray(x) for x in (q, k, v, cu_q, cu_k)), causal=True)
    np.testing.assert_array_equal(np.asarray(j), ref)


# ---- bad input -------------------------------------------------------------------------------

def _small(rng):
    q = _packed(rng, 6, 2, 8, np.float32)
    k = _packed(rng, 9, 1, 8, np.float32)
    return q, k, k.copy(), cu_seqlens([2, 4]), cu_seqlens([4, 5])


def test_index_dtype_must_be_int32(rng):
    q, k, v, cu_q, cu_k = _small(rng)
    with pytest.raises(TypeError, match="cu_seqlens_q must have dtype int32; got int64"):
        waveboost.attention_varlen(q, k, v, cu_q.astype(np.int64), cu_k)
    with pytest.raises(TypeError, match="cu_seqlens_k must have dtype int32"):
        waveboost.attention_varlen(q, k, v, cu_q, cu_k.astype(np.uint32), max_seqlen_k=5)
    with pytest.raises(TypeError, match="seqused_k must have dtype int32"):
        waveboost.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=np.array([1, 1], dtype=np.int64))


def test_shape_mismatches_name_the_argument(rng):
    q, k, v, cu_q, cu_k = _small(rng)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must have shape \(batch \+ 1,\) = \(3,\)"):
        waveboost.attention_varlen(q, k, v, cu_q, cu_k[:2])
    with pytest.raises(ValueError, match="q must be a 3-D tensor"):
        waveboost.attention_varlen(q[None], k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match="v has shape"):
        waveboost.attention_varlen(q, k, v[:8], cu_q, cu_k)
    with pytest.raises(ValueError, match="head_dim"):
        waveboost.attention_varlen(q, k[..., :4], v[..., :4], cu_q, cu_k)
    with pytest.raises(ValueError, match=r"seqused_k must have shape \(batch,\)"):
        waveboost.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="lse|out"):
        waveboost.attention_varlen(q, k, v, cu_q, cu_k, out=np.empty((5, 2, 8), np.float32))
    with pytest.raises(ValueError, match="cu_seqlens_k is required"):
        waveboost.attention_varlen(q, k, v, cu_q, None)


def test_paged_shape_errors(rng):
    q = _packed(rng, 4, 2, 8, np.float32)
    pages = rng.standard_normal((5, 4, 1, 8)).astype(np.float32)
    cu_q = cu_seqlens([2, 2])
    with pytest.raises(ValueError, match=r"block_table must have shape \(batch, max_pages\)"):
        waveboost.attention_varlen(q, pages, pages, cu_q, None, block_table=np.zeros((3, 2), np.int32))
    with pytest.raises(TypeError, match="block_table must have dtype int32"):
        waveboost.attention_varlen(q, pages, pages, cu_q, None, block_table=np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match="k must be a 4-D tensor .*num_pages, page_size"):
        waveboost.attention_varlen(q, pages[0], pages[0], cu_q, None, block_table=np.zeros((2, 2), np.int32))
    empty_pages = np.zeros((5, 0, 1, 8), np.float32)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        waveboost.attention_varlen(q, empty_pages, empty_pages, cu_q, None, block_table=np.zeros((2, 2), np.int32))


def test_validate_catches_bad_indices(rng):
    q, k, v, cu_q, cu_k = _small(rng)
    with pytest.raises(ValueError, match="cu_seqlens_q must be non-decreasing"):
        waveboost.attention_varlen(q, k, v, np.array([0, 4, 2], np.int32), cu_k, validate=True)
    with pytest.raises(ValueError, match="cu_seqlens_k must start at 0"):
        waveboost.attention_varlen(q, k, v, cu_q, np.array([1, 4, 5], np.int32), validate=True)
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\] = 12 exceeds the 9 packed rows"):
        waveboost.attention_varlen(q, k, v, cu_q, np.array([0, 4, 12], np.int32), validate=True)
    with pytest.raises(ValueError, match="more than max_seqlen"):
        waveboost.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=3, validate=True)
    with pytest.raises(ValueError, match=r"seqused_k\[1\] = 6 is outside \[0, 5\]"):
        waveboost.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=np.array([4, 6], np.int32), validate=True)
    pages = rng.standard_normal((5, 4, 1, 8)).astype(np.float32)
    table = np.array([[0, 1], [2, 5]], np.int32)
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 5 is not a page id in \[0, 5\)"):
        waveboost.attention_varlen(q, pages, pages, cu_q, None, block_table=table, validate=True)
    # Pages past a sequence's fill are never read, so they may hold anything (e.g. -1 padding).
    used = np.array([8, 3], np.int32)
    table[1, 1] = -1
    waveboost.attention_varlen(q, pages, pages, cu_q, None, block_table=table, seqused_k=used, validate=True)


def test_cpu_backend_checks_indices_without_validate(rng):
    # The CPU path reads the indices anyway: a bad one is an error, never an out-of-bounds read.
    q, k, v, cu_q, cu_k = _small(rng)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        waveboost.attention_varlen(q, k, v, np.array([0, 4, 2], np.int32), cu_k, max_seqlen_q=6)
    with pytest.raises(ValueError, match="cu_seqlens_k must lie in"):
        waveboost.attention_varlen(q, k, v, cu_q, np.array([0, 4, 12], np.int32), max_seqlen_k=12)
    with pytest.raises(ValueError, match="more than max_seqlen_k"):
        waveboost.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_k=2)
    pages = rng.standard_normal((5, 4, 1, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = 7"):
        waveboost.attention_varlen(q, pages, pages, cu_q, None, block_table=np.array([[0, 7], [1, 2]], np.int32))


def test_backends_without_sequence_layouts_refuse(rng):
    q, k, v, cu_q, cu_k = _small(rng)
    with pytest.raises(ValueError, match="backend"):
        waveboost.attention_varlen(q, k, v, cu_q, cu_k, backend="mma")
    with pytest.raises(ValueError, match="backend must be one of"):
        waveboost.attention_varlen(q, k, v, cu_q, cu_k, backend="fast")


# ---- GPU -------------------------------------------------------------------------------------

def _assert_half_rule(out, qkv, cu_q, cu_k, causal, seqused_k=None):
    """max|out - ref| <= 2 max|same-dtype naive - ref| + atol, per sequence (torch CUDA tensors)."""
    import torch

    from reference import attention_ref_torch

    q, k, v = qkv
    got = out.double()
    assert not bool(got.isnan().any()), "unwritten (NaN-poisoned) or NaN output rows"
    err = naive_err = 0.0
    scale = 1 / math.sqrt(q.shape[-1])
    for b in range(len(cu_q) - 1):
        q0, q1, k0 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b])
        k1 = k0 + int(seqused_k[b]) if seqused_k is not None else int(cu_k[b + 1])
        args = (q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal, scale)
        ref, _ = attention_ref_torch(*args)
        naive, _ = attention_ref_torch(*args, dtype=q.dtype)
        if q1 > q0:
            err = max(err, float((got[q0:q1] - ref[0]).abs().max()))
            naive_err = max(naive_err, float((naive[0].double() - ref[0]).abs().max()))
    atol = 2e-4 if q.dtype == torch.float16 else 2e-3  # as tests/test_gpu.py
    assert err <= 2 * naive_err + atol, f"max err {err:.3g} vs same-dtype naive {naive_err:.3g}"



def _cuda_backend_or_skip(call, backend):
    """Runs call(backend); skips (with can_implement's reason) when that backend refuses the layout."""
    try:
        return call(backend)
    except ValueError as e:
        message = str(e)
        if "backend" in message and any(w in message for w in ("runs dense batches only", "not supported",
                                                               "supports", "needs", "not implemented")):
            pytest.skip(f"backend {backend!r} cannot run this layout: {message}")
        raise


@pytest.mark.gpu
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_varlen(rng, backend, dtype, causal):
    import torch

    batch, heads, heads_kv, head_dim = 6, 8, 2, 128
    lq, lk = _lengths(rng, batch, 257), _lengths(rng, batch, 1025)
    cu_q, cu_k = cu_seqlens(lq), cu_seqlens(lk)
    q = _packed(rng, cu_q[-1], heads, head_dim, np.float32)
    k, v = (_packed(rng, cu_k[-1], heads_kv, head_dim, np.float32) for _ in range(2))
    tdtype = getattr(torch, dtype)
    dev = [torch.from_numpy(x).to("cuda", tdtype) for x in (q, k, v)]
    idx = [torch.from_numpy(x).cuda() for x in (cu_q, cu_k)]
    out = torch.full_like(dev[0], float("nan"))
    _cuda_backend_or_skip(lambda b: waveboost.attention_varlen(
        *dev, *idx, max_seqlen_q=int(lq.max()), max_seqlen_k=int(lk.max()), causal=causal, out=out,
        backend=b), backend)
    torch.cuda.synchronize()
    _assert_half_rule(out, dev, cu_q, cu_k, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_gpu_paged_varlen(rng, backend, page_size):
    import torch

    batch, heads, heads_kv, head_dim = 3, 8, 2, 128
    max_len = page_size * 4
    cache = rng.standard_normal((batch, max_len, heads_kv, head_dim)).astype(np.float32)
    pages, table = paged_from_contiguous(rng, cache, page_size)
    used = np.array([0, 1, max_len - 3], np.int32)
    lq = np.array([1, 1, 5])
    cu_q = cu_seqlens(lq)
    q = _packed(rng, cu_q[-1], heads, head_dim, np.float32)
    tq, tp = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in (q, pages))
    out = torch.full_like(tq, float("nan"))
    _cuda_backend_or_skip(lambda b: waveboost.attention_varlen(
        tq, tp, tp, torch.from_numpy(cu_q).cuda(), None, max_seqlen_q=5, block_table=torch.from_numpy(table).cuda(),
        seqused_k=torch.from_numpy(used).cuda(), causal=True, out=out, backend=b), backend)
    torch.cuda.synchronize()
    flat = torch.stack([torch.cat([tp[int(p)] for p in table[b]]) for b in range(batch)]).flatten(0, 1)
    _assert_half_rule(out, (tq, flat, flat), cu_q, np.arange(batch + 1) * max_len, True, seqused_k=used)


def test_default_scale_is_inverse_sqrt_head_dim(rng):
    q, k, v, cu_q, cu_k = _small(rng)
    a = waveboost.attention_varlen(q, k, v, cu_q, cu_k)
    b = waveboost.attention_varlen(q, k, v, cu_q, cu_k, softmax_scale=1 / math.sqrt(8))
    np.testing.assert_array_equal(a, b)


# ---- properties ------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 5),
    heads_kv=st.sampled_from([1, 2, 3]),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.integers(1, 40),
    page_size=st.integers(1, 17),
    causal=st.booleans(),
)
def test_paged_varlen_property(data, batch, heads_kv, group, head_dim, page_size, causal):
    # Random query and key lengths (0 included), a paged cache with pages in random order and
    # spare pages, every layout equal to the per-sequence float64 reference.
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    lq = np.array(data.draw(st.lists(st.integers(0, 20), min_size=batch, max_size=batch)))
    used = np.array(data.draw(st.lists(st.integers(0, 40), min_size=batch, max_size=batch)), dtype=np.int32)
    max_pages = max(1, -(-int(used.max()) // page_size))
    heads = heads_kv * group
    cache_k = rng.standard_normal((batch, max_pages * page_size, heads_kv, head_dim))
    cache_v = rng.standard_normal((batch, max_pages * page_size, heads_kv, head_dim))
    k_pages, table = paged_from_contiguous(rng, cache_k, page_size)
    v_pages = rng.standard_normal(k_pages.shape)
    for b in range(batch):
        for i in range(max_pages):
            v_pages[table[b, i]] = cache_v[b, i * page_size:(i + 1) * page_size]
    cu_q = cu_seqlens(lq)
    q = rng.standard_normal((int(cu_q[-1]), heads, head_dim))
    out = np.full_like(q, np.nan)
    _, lse = waveboost.attention_varlen(q, k_pages, v_pages, cu_q, None, block_table=table, seqused_k=used,
                                        causal=causal, out=out, return_lse=True, validate=True)
    cap = max_pages * page_size
    ref, ref_lse = attention_varlen_ref(q, cache_k.reshape(-1, heads_kv, head_dim),
                                        cache_v.reshape(-1, heads_kv, head_dim), cu_q,
                                        np.arange(batch + 1) * cap, causal=causal, seqused_k=used)
    _check(out, lse, ref, ref_lse, np.float64, int(cu_q[-1]))
    # The same keys packed (varlen k) give the same result.
    cu_k = cu_seqlens(used)
    packed_k = np.concatenate([cache_k[b, :used[b]] for b in range(batch)]) if cu_k[-1] else cache_k[0, :0]
    packed_v = np.concatenate([cache_v[b, :used[b]] for b in range(batch)]) if cu_k[-1] else cache_v[0, :0]
    packed = waveboost.attention_varlen(q, packed_k, packed_v, cu_q, cu_k, causal=causal)
    np.testing.assert_allclose(packed, out, rtol=1e-12, atol=1e-12)


# ---- JAX -------------------------------------------------------------------------------------

@pytest.mark.parametrize("paged", [False, True], ids=["packed", "paged"])
def test_jax_varlen_under_jit(rng, paged):
    jax = pytest.importorskip("jax")
    wbj = pytest.importorskip("waveboost.jax")
    if not wbj.varlen_ffi_available():
        pytest.skip("this build of waveboost has no XLA FFI handlers (jaxlib's headers were not found)")
    batch, heads, heads_kv, head_dim, page_size = 4, 4, 2, 32, 8
    lq = np.array([3, 0, 1, 9])
    used = np.array([5, 7, 0, 24], np.int32)
    cu_q, cu_k = cu_seqlens(lq), cu_seqlens(used)
    q = _packed(rng, cu_q[-1], heads, head_dim, np.float32)
    cache = rng.standard_normal((batch, 24, heads_kv, head_dim)).astype(np.float32)
    pages, table = paged_from_contiguous(rng, cache, page_size)
    packed = np.concatenate([cache[b, :used[b]] for b in range(batch)])
    expected = waveboost.attention_varlen(q, packed, packed, cu_q, cu_k, causal=True)
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        jq, jcu_q, jcu_k, jused, jtable = (jax.numpy.asarray(x) for x in (q, cu_q, cu_k, used, table))
        if paged:
            kv = jax.numpy.asarray(pages)
            fn = jax.jit(lambda q, kv, cu_q, used, table: wbj.attention_varlen(
                q, kv, kv, cu_q, None, max_seqlen_q=9, block_table=table, seqused_k=used, causal=True))
            out = fn(jq, kv, jcu_q, jused, jtable)
        else:
            kv = jax.numpy.asarray(packed)
            fn = jax.jit(lambda q, kv, cu_q, cu_k: wbj.attention_varlen(
                q, kv, kv, cu_q, cu_k, max_seqlen_q=9, max_seqlen_k=24, causal=True))
            out = fn(jq, kv, jcu_q, jcu_k)
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6, atol=1e-6)
        # waveboost.attention_varlen takes the same route for JAX arrays, eagerly too.
        eager = waveboost.attention_varlen(jq, jax.numpy.asarray(packed), jax.numpy.asarray(packed), jcu_q, jcu_k,
                                           causal=True)
        np.testing.assert_array_equal(np.asarray(eager), expected)
        with pytest.raises(ValueError, match="max_seqlen_q is required under jit"):
            jax.jit(lambda q, kv, cu_q, cu_k: wbj.attention_varlen(q, kv, kv, cu_q, cu_k, max_seqlen_k=24))(
                jq, jax.numpy.asarray(packed), jcu_q, jcu_k)
        with pytest.raises(TypeError, match="cu_seqlens_k must have dtype int32"):
            wbj.attention_varlen(jq, jax.numpy.asarray(packed), jax.numpy.asarray(packed), jcu_q,
                                 jcu_k.astype(jax.numpy.float32))


# ---- GPU: the tensor-core flash paths (mma, wgmma) on sequence layouts --------------------------

TC_BACKENDS = ("mma", "wgmma")


def _require_backend(backend):
    if backend not in waveboost.info()["backends"]:
        pytest.skip(f"backend {backend!r} is not available on this GPU / build")


def _check_gpu_lse(lse, q, k, v, cu_q, cu_k, causal, seqused_k=None):
    """lse (heads, total_q) against the float64 reference per sequence; -inf exactly where it must be."""
    import torch

    from reference import attention_ref_torch

    scale = 1 / math.sqrt(q.shape[-1])
    for b in range(len(cu_q) - 1):
        q0, q1, k0 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b])
        k1 = k0 + int(seqused_k[b]) if seqused_k is not None else int(cu_k[b + 1])
        if q1 == q0:
            continue
        _, ref = attention_ref_torch(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal, scale)
        got = lse[:, q0:q1].double()
        ref = ref[0]
        assert torch.equal(torch.isneginf(got), torch.isneginf(ref)), f"sequence {b}: LSE -inf rows differ"
        finite = torch.isfinite(ref)
        assert bool(torch.isfinite(got[finite]).all()), f"sequence {b}: non-finite LSE"
        if bool(finite.any()):
            assert float((got[finite] - ref[finite]).abs().max()) < 1e-3, f"sequence {b}: LSE off"


def _lengths_tc(rng, batch, long_len, short_max=300):
    """Lengths with 0 and 1, short ones up to short_max (tails of every tile size) and one long."""
    lengths = list(rng.integers(2, short_max, size=batch))
    lengths[0] = 0
    lengths[1] = 1
    lengths[int(rng.integers(2, batch))] = long_len
    return np.array(lengths)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TC_BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,heads_kv", [(4, 4), (8, 2), (8, 1)], ids=["mha", "gqa4", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_varlen_tensor_core(rng, backend, dtype, head_dim, heads, heads_kv, causal):
    # Random lengths (0, 1, short tails, one long among them), Lq and Lk independent per sequence
    # (causal rows with no key where Lq > Lk), every row checked, LSE included.
    import torch

    _require_backend(backend)
    batch = 7
    lq, lk = _lengths_tc(rng, batch, 1100), _lengths_tc(rng, batch, 1300)
    cu_q, cu_k = cu_seqlens(lq), cu_seqlens(lk)
    tdtype = getattr(torch, dtype)
    q = torch.randn(int(cu_q[-1]), heads, head_dim, device="cuda", dtype=tdtype)
    k = torch.randn(int(cu_k[-1]), heads_kv, head_dim, device="cuda", dtype=tdtype)
    v = torch.randn(int(cu_k[-1]), heads_kv, head_dim, device="cuda", dtype=tdtype)
    out = torch.full_like(q, float("nan"))
    _, lse = waveboost.attention_varlen(
        q, k, v, torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda(), max_seqlen_q=int(lq.max()),
        max_seqlen_k=int(lk.max()), causal=causal, out=out, return_lse=True, backend=backend)
    torch.cuda.synchronize()
    _assert_half_rule(out, (q, k, v), cu_q, cu_k, causal)
    _check_gpu_lse(lse, q, k, v, cu_q, cu_k, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TC_BACKENDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_varlen_seqused_k_tensor_core(rng, backend, causal):
    import torch

    _require_backend(backend)
    batch, heads, heads_kv, head_dim = 5, 8, 2, 128
    lq = np.array([0, 1, 130, 257, 64])
    lk = np.array([40, 3, 700, 300, 1])
    used = np.array([40, 0, 513, 129, 1], np.int32)
    cu_q, cu_k = cu_seqlens(lq), cu_seqlens(lk)
    q = torch.randn(int(cu_q[-1]), heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(int(cu_k[-1]), heads_kv, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(int(cu_k[-1]), heads_kv, head_dim, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    _, lse = waveboost.attention_varlen(
        q, k, v, torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda(), max_seqlen_q=int(lq.max()),
        max_seqlen_k=int(lk.max()), seqused_k=torch.from_numpy(used).cuda(), causal=causal, out=out,
        return_lse=True, backend=backend)
    torch.cuda.synchronize()
    _assert_half_rule(out, (q, k, v), cu_q, cu_k, causal, seqused_k=used)
    _check_gpu_lse(lse, q, k, v, cu_q, cu_k, causal, seqused_k=used)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TC_BACKENDS)
@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_paged_prefill_tensor_core(rng, backend, page_size, head_dim, causal):
    # Chunked prefill on a paged cache: each sequence's new queries against its cached keys, pages
    # shuffled (not contiguous, spare pages in the pool), fills with tails of every tile size.
    import torch

    _require_backend(backend)
    batch, heads, heads_kv = 4, 8, 2
    max_len = page_size * max(1, -(-1100 // page_size))
    cache = rng.standard_normal((batch, max_len, heads_kv, head_dim)).astype(np.float32)
    cache_v = rng.standard_normal((batch, max_len, heads_kv, head_dim)).astype(np.float32)
    k_pages, table = paged_from_contiguous(rng, cache, page_size)
    v_pages = np.empty_like(k_pages)
    v_pages[:] = rng.standard_normal(v_pages.shape)
    for b in range(batch):
        for i in range(table.shape[1]):
            v_pages[table[b, i]] = cache_v[b, i * page_size:(i + 1) * page_size]
    used = np.array([0, 1, 1037, 300], np.int32)
    lq = np.array([3, 1, 400, 300])
    cu_q = cu_seqlens(lq)
    tq = torch.randn(int(cu_q[-1]), heads, head_dim, device="cuda", dtype=torch.bfloat16)
    tk, tv = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in (k_pages, v_pages))
    out = torch.full_like(tq, float("nan"))
    _, lse = waveboost.attention_varlen(
        tq, tk, tv, torch.from_numpy(cu_q).cuda(), None, max_seqlen_q=int(lq.max()),
        block_table=torch.from_numpy(table).cuda(), seqused_k=torch.from_numpy(used).cuda(), causal=causal, out=out,
        return_lse=True, backend=backend)
    torch.cuda.synchronize()
    flat_k = torch.stack([torch.cat([tk[int(p)] for p in table[b]]) for b in range(batch)]).flatten(0, 1)
    flat_v = torch.stack([torch.cat([tv[int(p)] for p in table[b]]) for b in range(batch)]).flatten(0, 1)
    cu_k = np.arange(batch + 1) * max_len
    _assert_half_rule(out, (tq, flat_k, flat_v), cu_q, cu_k, causal, seqused_k=used)
    _check_gpu_lse(lse, tq, flat_k, flat_v, cu_q, cu_k, causal, seqused_k=used)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TC_BACKENDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_varlen_equals_dense_on_equal_lengths(rng, backend, causal):
    # Equal lengths packed: the sequence-layout kernel does each sequence's work as the dense one does.
    import torch

    _require_backend(backend)
    b, lq, lk, h, hkv, d = 4, 300, 517, 8, 2, 128  # 96 blocks of 128 rows: no split-KV on wgmma
    q = torch.randn(b, lq, h, d, device="cuda", dtype=torch.float16)
    k = torch.randn(b, lk, hkv, d, device="cuda", dtype=torch.float16)
    v = torch.randn(b, lk, hkv, d, device="cuda", dtype=torch.float16)
    dense, dense_lse = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
    out, lse = waveboost.attention_varlen(
        q.reshape(b * lq, h, d), k.reshape(b * lk, hkv, d), v.reshape(b * lk, hkv, d),
        torch.from_numpy(cu_seqlens([lq] * b)).cuda(), torch.from_numpy(cu_seqlens([lk] * b)).cuda(),
        max_seqlen_q=lq, max_seqlen_k=lk, causal=causal, return_lse=True, backend=backend)
    torch.cuda.synchronize()
    assert torch.equal(out.reshape(b, lq, h, d), dense)
    assert torch.equal(lse.reshape(h, b, lq).transpose(0, 1), dense_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TC_BACKENDS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_nan_in_other_rows_stays_there(rng, backend, head_dim, causal):
    # A key tile past a sequence's end holds other rows of the tensor: the next sequence's keys
    # (varlen) or a cache's unfilled slots (seqused_k). NaN there must reach no output that does
    # not read it: sequences 0 and 2 end inside a tile whose other rows are NaN.
    import torch

    _require_backend(backend)
    heads, heads_kv = 8, 2
    lk = np.array([70, 200, 33, 300])
    used = np.array([70, 150, 33, 129], np.int32)
    lq = np.array([70, 64, 40, 300])
    cu_q, cu_k = cu_seqlens(lq), cu_seqlens(lk)
    q = torch.randn(int(cu_q[-1]), heads, head_dim, device="cuda", dtype=torch.float16)
    k = torch.randn(int(cu_k[-1]), heads_kv, head_dim, device="cuda", dtype=torch.float16)
    v = torch.randn(int(cu_k[-1]), heads_kv, head_dim, device="cuda", dtype=torch.float16)
    for seqused in (None, used):
        kk, vv = k.clone(), v.clone()
        if seqused is None:  # sequences 1 and 3: NaN keys and values (their own outputs are NaN)
            for b in (1, 3):
                kk[int(cu_k[b]):int(cu_k[b + 1])] = float("nan")
                vv[int(cu_k[b]):int(cu_k[b + 1])] = float("nan")
            clean = (0, 2)
        else:  # every sequence: NaN past its fill
            for b in range(len(lk)):
                kk[int(cu_k[b]) + int(used[b]):int(cu_k[b + 1])] = float("nan")
                vv[int(cu_k[b]) + int(used[b]):int(cu_k[b + 1])] = float("nan")
            clean = range(len(lk))
        out = torch.full_like(q, float("nan"))
        waveboost.attention_varlen(
            q, kk, vv, torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda(), max_seqlen_q=int(lq.max()),
            max_seqlen_k=int(lk.max()), causal=causal, out=out, backend=backend,
            seqused_k=None if seqused is None else torch.from_numpy(seqused).cuda())
        torch.cuda.synchronize()
        for b in clean:
            q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
            sub_q = q[q0:q1]
            k0 = int(cu_k[b])
            k1 = k0 + (int(seqused[b]) if seqused is not None else int(lk[b]))
            _assert_half_rule(out[q0:q1], (sub_q, kk[k0:k1], vv[k0:k1]), np.array([0, q1 - q0]),
                              np.array([0, k1 - k0]), causal)


def _resolved_sequences(q, k, v, cu_q, cu_k, max_q, max_k, block_table=None, seqused_k=None):
    """The backend attention_varlen's "auto" picks for these tensors (checked, not launched)."""
    from waveboost import _waveboost

    return _waveboost.forward_sequences(q, k, v, torch_empty_like(q), None, cu_q, cu_k, seqused_k, block_table, max_q,
                                        max_k, True, None, "auto", 0, True)


def torch_empty_like(x):
    import torch

    return torch.empty_like(x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_auto_picks_tensor_cores_for_prefill_and_decode_for_few_queries(dtype, head_dim):
    import torch

    tdtype = getattr(torch, dtype)
    info = waveboost.info()
    flash = [b for b in TC_BACKENDS if b in info["backends"]]
    if not flash or "decode" not in info["backends"]:
        pytest.skip(f"needs decode and a tensor-core flash backend; this GPU / build has {info['backends']}")
    heads, heads_kv, batch = 8, 2, 4
    lengths = np.array([700, 1, 2048, 0])
    cu = torch.from_numpy(cu_seqlens(lengths)).cuda()
    q = torch.randn(int(lengths.sum()), heads, head_dim, device="cuda", dtype=tdtype)
    k = torch.randn(int(lengths.sum()), heads_kv, head_dim, device="cuda", dtype=tdtype)
    # wgmma (its TMA kernel takes packed K/V of a known extent, which attention_varlen gives), else mma.
    wgmma = "wgmma" if "wgmma" in flash else "mma"
    assert _resolved_sequences(q, k, k, cu, cu, 2048, 2048) == wgmma
    # One new query per sequence against the same keys: decode.
    q1 = torch.randn(batch, heads, head_dim, device="cuda", dtype=tdtype)
    cu1 = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    assert _resolved_sequences(q1, k, k, cu1, cu, 1, 2048) == "decode"
    # Paged chunked prefill: a flash path; paged decode: decode.
    pages = torch.randn(64, 256, heads_kv, head_dim, device="cuda", dtype=tdtype)
    table = torch.randperm(64, device="cuda").reshape(batch, 16).to(torch.int32)
    used = torch.tensor([700, 1, 2048, 0], dtype=torch.int32, device="cuda")
    assert _resolved_sequences(q, pages, pages, cu, None, 2048, None, table, used) == wgmma
    assert _resolved_sequences(q1, pages, pages, cu1, None, 1, None, table, used) == "decode"
    # What the flash paths refuse (a page size that is not a power of two) still runs, on decode.
    odd = torch.randn(64, 48, heads_kv, head_dim, device="cuda", dtype=tdtype)
    assert _resolved_sequences(q, odd, odd, cu, None, 2048, None, table, used) == "decode"
    for backend in flash:
        with pytest.raises(ValueError, match="power of two"):
            waveboost.attention_varlen(q, odd, odd, cu, None, max_seqlen_q=2048, block_table=table, seqused_k=used,
                                       backend=backend)
