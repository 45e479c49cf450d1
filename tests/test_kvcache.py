"""waveboost.attention_with_kvcache: decode and speculative verify against contiguous and paged
KV caches, with and without appending new keys, against float64 references."""

from __future__ import annotations

import math

import numpy as np
import pytest

import waveboost
from reference import attention_ref, paged_from_contiguous, rel_err

CUDA_BACKENDS = tuple(b for b in waveboost.BACKENDS if b != "cpu")


def _cache(rng, batch, max_len, heads_kv, head_dim, dtype=np.float32):
    return tuple(rng.standard_normal((batch, max_len, heads_kv, head_dim)).astype(dtype) for _ in range(2))


def _ref(q, k_cache, v_cache, lengths, causal):
    """Per sequence: q[b] against the first lengths[b] keys of the contiguous cache."""
    outs, lses = [], []
    for b, n in enumerate(lengths):
        o, l = attention_ref(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], causal=causal)
        outs.append(o)
        lses.append(l)
    return np.concatenate(outs), np.concatenate(lses)


def _check(out, lse, ref, ref_lse, tol):
    out, lse = np.asarray(out), np.asarray(lse)
    assert not np.isnan(out).any(), "unwritten (NaN-poisoned) or NaN output elements"
    assert rel_err(out, ref) < tol
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=2e-6, atol=2e-6)


def _paged(rng, k_cache, v_cache, page_size):
    """Paged copies of both caches sharing one shuffled block table."""
    k_pages, table = paged_from_contiguous(rng, k_cache, page_size)
    v_pages = rng.standard_normal(k_pages.shape).astype(k_pages.dtype)
    for b in range(table.shape[0]):
        for i in range(table.shape[1]):
            v_pages[table[b, i]] = v_cache[b, i * page_size:(i + 1) * page_size]
    return k_pages, v_pages, table


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("heads,heads_kv", [(4, 4), (8, 4), (16, 2), (64, 1)], ids=lambda x: str(x))
@pytest.mark.parametrize("seqlen_q,causal", [(1, False), (1, True), (4, True), (7, False)])
def test_contiguous_cache(rng, dtype, heads, heads_kv, seqlen_q, causal):
    batch, max_len, head_dim = 4, 300, 64
    k_cache, v_cache = _cache(rng, batch, max_len, heads_kv, head_dim, dtype)
    lengths = np.array([0, 1, 257, 97], dtype=np.int32)
    q = rng.standard_normal((batch, seqlen_q, heads, head_dim)).astype(dtype)
    out = np.full_like(q, np.nan)
    res, lse = waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths, causal=causal, out=out,
                                                return_lse=True)
    assert res is out and lse.shape == (batch, heads, seqlen_q)
    ref, ref_lse = _ref(q, k_cache, v_cache, lengths, causal)
    _check(out, lse, ref, ref_lse, 1e-5 if dtype == np.float32 else 1e-12)


def test_cache_seqlens_zero_gives_zeros_and_minus_inf(rng):
    k_cache, v_cache = _cache(rng, 2, 16, 2, 32)
    q = rng.standard_normal((2, 3, 4, 32)).astype(np.float32)
    out, lse = waveboost.attention_with_kvcache(q, k_cache, v_cache, np.zeros(2, np.int32), return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


@pytest.mark.parametrize("page_size", [1, 5, 16, 64])
@pytest.mark.parametrize("seqlen_q,causal", [(1, True), (5, True), (3, False)])
def test_paged_matches_contiguous(rng, page_size, seqlen_q, causal):
    batch, heads, heads_kv, head_dim = 3, 8, 2, 64
    max_len = page_size * -(-130 // page_size)
    k_cache, v_cache = _cache(rng, batch, max_len, heads_kv, head_dim)
    k_pages, v_pages, table = _paged(rng, k_cache, v_cache, page_size)
    lengths = np.array([max_len, 0, 77], dtype=np.int32)
    q = rng.standard_normal((batch, seqlen_q, heads, head_dim)).astype(np.float32)
    paged, paged_lse = waveboost.attention_with_kvcache(q, k_pages, v_pages, lengths, block_table=table,
                                                        causal=causal, return_lse=True)
    contiguous, contiguous_lse = waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths, causal=causal,
                                                                  return_lse=True)
    ref, ref_lse = _ref(q, k_cache, v_cache, lengths, causal)
    _check(paged, paged_lse, ref, ref_lse, 1e-5)
    np.testing.assert_allclose(paged, contiguous, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("seqlen_new", [1, 4])
def test_k_new_lands_at_cache_end_and_nothing_else_changes(rng, paged, seqlen_new):
    batch, max_len, heads, heads_kv, head_dim, page_size = 3, 48, 8, 2, 16, 8
    k_cache, v_cache = _cache(rng, batch, max_len, heads_kv, head_dim)
    lengths = np.array([0, 17, max_len - seqlen_new], dtype=np.int32)
    k_new = rng.standard_normal((batch, seqlen_new, heads_kv, head_dim)).astype(np.float32)
    v_new = rng.standard_normal((batch, seqlen_new, heads_kv, head_dim)).astype(np.float32)
    q = rng.standard_normal((batch, seqlen_new, heads, head_dim)).astype(np.float32)

    expected_k, expected_v = k_cache.copy(), v_cache.copy()
    for b, n in enumerate(lengths):
        expected_k[b, n:n + seqlen_new] = k_new[b]
        expected_v[b, n:n + seqlen_new] = v_new[b]

    if paged:
        k_store, v_store, table = _paged(rng, k_cache, v_cache, page_size)
        expected_k_store, expected_v_store, _ = k_store.copy(), v_store.copy(), None
        for b, n in enumerate(lengths):
            for i in range(seqlen_new):
                page, row = table[b, (n + i) // page_size], (n + i) % page_size
                expected_k_store[page, row] = k_new[b, i]
                expected_v_store[page, row] = v_new[b, i]
    else:
        k_store, v_store, table = k_cache, v_cache, None
        expected_k_store, expected_v_store = expected_k, expected_v
    lengths_before = lengths.copy()
    out, lse = waveboost.attention_with_kvcache(q, k_store, v_store, lengths, block_table=table, k_new=k_new,
                                                v_new=v_new, causal=True, return_lse=True)
    # Every element of the cache, spare pages included, is as expected: new rows where they belong,
    # everything else untouched; cache_seqlens is not advanced by the call.
    np.testing.assert_array_equal(k_store, expected_k_store)
    np.testing.assert_array_equal(v_store, expected_v_store)
    np.testing.assert_array_equal(lengths, lengths_before)
    # Attention sees the appended keys; causal is bottom-right (query i sees keys <= n + i).
    ref, ref_lse = _ref(q, expected_k, expected_v, lengths + seqlen_new, True)
    _check(out, lse, ref, ref_lse, 1e-5)


def test_speculative_verify_is_bottom_right_causal(rng):
    # Query i of 4 sees the cache plus new keys 0..i: the same as 4 separate decode steps.
    k_cache, v_cache = _cache(rng, 1, 32, 2, 16, np.float64)
    q = rng.standard_normal((1, 4, 4, 16))
    n = np.array([10], np.int32)
    full = waveboost.attention_with_kvcache(q, k_cache, v_cache, n + 4, causal=True)
    for i in range(4):
        step = waveboost.attention_with_kvcache(q[:, i:i + 1], k_cache, v_cache, n + i + 1)
        np.testing.assert_allclose(full[:, i:i + 1], step, rtol=1e-12, atol=1e-12)


def test_decode_loop_on_a_paged_cache(rng):
    # Prefill nothing, then append one token per step; the final step equals one-shot attention.
    page_size, steps, heads, heads_kv, head_dim = 4, 11, 4, 2, 16
    k_pages = np.zeros((8, page_size, heads_kv, head_dim), np.float64)
    v_pages = np.zeros_like(k_pages)
    table = rng.permutation(8)[:4].reshape(1, 4).astype(np.int32)
    ks = rng.standard_normal((1, steps, heads_kv, head_dim))
    vs = rng.standard_normal((1, steps, heads_kv, head_dim))
    qs = rng.standard_normal((1, steps, heads, head_dim))
    lengths = np.zeros(1, np.int32)
    for t in range(steps):
        out = waveboost.attention_with_kvcache(qs[:, t:t + 1], k_pages, v_pages, lengths, block_table=table,
                                               k_new=ks[:, t:t + 1], v_new=vs[:, t:t + 1])
        lengths += 1
    ref, _ = attention_ref(qs[:, -1:], ks, vs)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_torch_cache_updated_in_place(rng):
    torch = pytest.importorskip("torch")
    k_cache, v_cache = (torch.from_numpy(x) for x in _cache(rng, 2, 8, 1, 16))
    k_new, v_new = torch.randn(2, 1, 1, 16), torch.randn(2, 1, 1, 16)
    q = torch.randn(2, 1, 2, 16)
    lengths = torch.tensor([3, 0], dtype=torch.int32)
    out = waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths, k_new=k_new, v_new=v_new)
    assert isinstance(out, torch.Tensor)
    assert torch.equal(k_cache[0, 3], k_new[0, 0]) and torch.equal(v_cache[1, 0], v_new[1, 0])


def test_jax_returns_updated_caches(rng):
    jax = pytest.importorskip("jax")
    with jax.default_device(jax.devices("cpu")[0]):
        _jax_returns_updated_caches(rng)


def _jax_returns_updated_caches(rng):
    import jax.numpy as jnp

    k_np, v_np = _cache(rng, 2, 8, 1, 16)
    k_cache, v_cache = jnp.asarray(k_np), jnp.asarray(v_np)
    k_new = jnp.asarray(rng.standard_normal((2, 2, 1, 16)).astype(np.float32))
    v_new = jnp.asarray(rng.standard_normal((2, 2, 1, 16)).astype(np.float32))
    q = jnp.asarray(rng.standard_normal((2, 2, 2, 16)).astype(np.float32))
    lengths = jnp.asarray(np.array([3, 6], np.int32))
    out, lse, k2, v2 = waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths, k_new=k_new, v_new=v_new,
                                                        causal=True, return_lse=True)
    np.testing.assert_array_equal(np.asarray(k_cache), k_np)  # inputs are immutable
    np.testing.assert_array_equal(np.asarray(k2)[0, 3:5], np.asarray(k_new)[0])
    np.testing.assert_array_equal(np.asarray(v2)[1, 6:8], np.asarray(v_new)[1])
    ref, _ = _ref(np.asarray(q), np.asarray(k2), np.asarray(v2), [5, 8], True)
    assert rel_err(np.asarray(out), ref) < 1e-5


# ---- bad input -------------------------------------------------------------------------------

def _inputs(rng):
    k_cache, v_cache = _cache(rng, 2, 8, 1, 16)
    q = rng.standard_normal((2, 1, 2, 16)).astype(np.float32)
    return q, k_cache, v_cache, np.array([2, 3], np.int32)


def test_bad_inputs_name_the_argument(rng):
    q, k_cache, v_cache, lengths = _inputs(rng)
    new = np.zeros((2, 1, 1, 16), np.float32)
    with pytest.raises(TypeError, match="cache_seqlens must have dtype int32; got int64"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths.astype(np.int64))
    with pytest.raises(TypeError, match="cache_seqlens must have dtype int32"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths.astype(np.int64), k_new=new, v_new=new)
    with pytest.raises(ValueError, match="k_new and v_new go together"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths, k_new=new)
    with pytest.raises(ValueError, match="k_new has batch 3 but q has 2"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths, k_new=np.zeros((3, 1, 1, 16), np.float32),
                                         v_new=np.zeros((3, 1, 1, 16), np.float32))
    with pytest.raises(ValueError, match="k_new has heads_kv 2"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths, k_new=np.zeros((2, 1, 2, 16), np.float32),
                                         v_new=np.zeros((2, 1, 2, 16), np.float32))
    with pytest.raises(TypeError, match="k_new has dtype float64"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths, k_new=new.astype(np.float64),
                                         v_new=new.astype(np.float64))
    with pytest.raises(ValueError, match=r"cache_seqlens must have shape \(batch,\) = \(2,\)"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths[:1])
    with pytest.raises(ValueError, match=r"block_table must have shape \(batch, max_pages\)"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths, block_table=np.zeros((1, 2), np.int32))
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        empty = np.zeros((4, 0, 1, 16), np.float32)
        waveboost.attention_with_kvcache(q, empty, empty, lengths, block_table=np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match="v has shape|v_cache has shape"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache[:, :4], lengths)


def test_validate_and_cpu_checks_catch_overflow(rng):
    q, k_cache, v_cache, lengths = _inputs(rng)
    new = np.ones((2, 2, 1, 16), np.float32)
    full = np.array([2, 7], np.int32)  # 7 + 2 > 8
    with pytest.raises(ValueError, match=r"cache_seqlens \+ seqlen_new\[1\] = 9 is outside \[0, 8\]"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, full, k_new=new, v_new=new, validate=True)
    before = k_cache.copy()
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 7 plus 2 new keys does not fit"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, full, k_new=new, v_new=new)
    np.testing.assert_array_equal(k_cache, before)  # nothing written on error
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 9 is outside \[0, 8\]"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, np.array([9, 1], np.int32), validate=True)
    pages = np.zeros((3, 4, 1, 16), np.float32)
    table = np.array([[0, 1], [2, 3]], np.int32)
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 3 is not a page id in \[0, 3\)"):
        waveboost.attention_with_kvcache(q, pages, pages, np.array([1, 6], np.int32), block_table=table,
                                         validate=True)
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 3"):
        waveboost.attention_with_kvcache(q, pages, pages.copy(), np.array([1, 3], np.int32), block_table=table,
                                         k_new=new, v_new=new)


def test_read_only_cache_refused_for_append(rng):
    q, k_cache, v_cache, lengths = _inputs(rng)
    k_cache.flags.writeable = False
    new = np.zeros((2, 1, 1, 16), np.float32)
    with pytest.raises(ValueError, match="k_cache must be writeable"):
        waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths, k_new=new, v_new=new)
    waveboost.attention_with_kvcache(q, k_cache, v_cache, lengths)  # reading a read-only cache is fine


# ---- GPU -------------------------------------------------------------------------------------

def _run_or_skip(call, backend):
    try:
        return call(backend)
    except ValueError as e:
        message = str(e)
        if "backend" in message and any(w in message for w in ("runs dense batches only", "not supported",
                                                               "supports", "needs", "not implemented")):
            pytest.skip(f"backend {backend!r} cannot run this layout: {message}")
        raise


def _half_rule(out, q, k_cache, v_cache, lengths, causal):
    import torch

    from reference import attention_ref_torch

    got = out.double()
    assert not bool(got.isnan().any()), "unwritten (NaN-poisoned) or NaN output elements"
    err = naive_err = 0.0
    scale = 1 / math.sqrt(q.shape[-1])
    for b, n in enumerate(lengths):
        args = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], causal, scale)
        ref, _ = attention_ref_torch(*args)
        naive, _ = attention_ref_torch(*args, dtype=q.dtype)
        err = max(err, float((got[b:b + 1] - ref).abs().max()))
        naive_err = max(naive_err, float((naive.double() - ref).abs().max()))
    atol = 2e-4 if q.dtype == torch.float16 else 2e-3
    assert err <= 2 * naive_err + atol, f"max err {err:.3g} vs same-dtype naive {naive_err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("heads,heads_kv", [(8, 8), (32, 8), (64, 1)], ids=lambda x: str(x))
@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("page_size", [None, 16, 256], ids=lambda p: f"page{p}")
def test_gpu_kvcache(rng, backend, dtype, heads, heads_kv, seqlen_q, page_size):
    import torch

    tdtype = getattr(torch, dtype)
    batch, head_dim, max_len = 3, 128, 1024
    k_np, v_np = _cache(rng, batch, max_len, heads_kv, head_dim)
    lengths = np.array([0, 1, max_len - seqlen_q - 3], np.int32)
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=tdtype)
    k_new = torch.randn(batch, seqlen_q, heads_kv, head_dim, device="cuda", dtype=tdtype)
    v_new = torch.randn(batch, seqlen_q, heads_kv, head_dim, device="cuda", dtype=tdtype)
    k_cache = torch.from_numpy(k_np).to("cuda", tdtype)
    v_cache = torch.from_numpy(v_np).to("cuda", tdtype)
    if page_size is None:
        k_store, v_store, table = k_cache.clone(), v_cache.clone(), None
    else:
        kp, vp, tb = _paged(rng, k_cache.float().cpu().numpy(), v_cache.float().cpu().numpy(), page_size)
        k_store, v_store = torch.from_numpy(kp).to("cuda", tdtype), torch.from_numpy(vp).to("cuda", tdtype)
        table = torch.from_numpy(tb).cuda()
    out = torch.full_like(q, float("nan"))
    _run_or_skip(lambda b: waveboost.attention_with_kvcache(
        q, k_store, v_store, torch.from_numpy(lengths).cuda(), block_table=table, k_new=k_new, v_new=v_new,
        causal=True, out=out, backend=b), backend)
    torch.cuda.synchronize()
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        expected_k[b, n:n + seqlen_q] = k_new[b]
        expected_v[b, n:n + seqlen_q] = v_new[b]
    if table is None:
        assert torch.equal(k_store, expected_k) and torch.equal(v_store, expected_v)
    else:
        gathered = torch.stack([torch.cat([k_store[int(p)] for p in tb[b]]) for b in range(batch)])
        assert torch.equal(gathered, expected_k)
    _half_rule(out, q, expected_k, expected_v, lengths + seqlen_q, True)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_jax_jit_decode_loop_with_donated_caches(rng, paged, device):
    jax = pytest.importorskip("jax")
    wbj = pytest.importorskip("waveboost.jax")
    if not wbj.kvcache_ffi_available():
        pytest.skip("this build of waveboost has no XLA FFI handlers (jaxlib's headers were not found)")
    if device == "gpu":
        if "CUDA" not in wbj._kvcache_platforms() or not any(d.platform == "gpu" for d in jax.devices()):
            pytest.skip("JAX sees no GPU, or waveboost's XLA handlers were built without CUDA")
        dtype = jax.numpy.bfloat16
    else:
        dtype = jax.numpy.float32
    with jax.default_device(jax.devices(device)[0]):
        _jax_decode_loop(rng, paged, dtype)


def _jax_decode_loop(rng, paged, dtype):
    import jax
    import jax.numpy as jnp

    import waveboost.jax as wbj

    # Head dim 64: the CUDA decode path specializes 64 and 128.
    batch, heads, heads_kv, head_dim, page_size, steps = 2, 4, 2, 64, 4, 9
    max_len = 12
    ks, vs = (jnp.asarray(rng.standard_normal((batch, steps, heads_kv, head_dim)), dtype) for _ in range(2))
    qs = jnp.asarray(rng.standard_normal((batch, steps, heads, head_dim)), dtype)
    if paged:
        pages = batch * max_len // page_size + 2
        table = jnp.asarray(rng.permutation(pages)[: pages - 2].reshape(batch, -1).astype(np.int32))
        shape = (pages, page_size, heads_kv, head_dim)
    else:
        table = None
        shape = (batch, max_len, heads_kv, head_dim)
    k_cache, v_cache = jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    @jax.jit
    def step_fn(q, kc, vc, lengths, kn, vn):
        out, kc, vc = wbj.attention_with_kvcache(q, kc, vc, lengths, block_table=table, k_new=kn, v_new=vn)
        return out, kc, vc, lengths + kn.shape[1]

    step = jax.jit(step_fn, donate_argnums=(1, 2))
    lengths = jnp.zeros((batch,), jnp.int32)
    for t in range(steps):
        out, k_cache, v_cache, lengths = step(qs[:, t:t + 1], k_cache, v_cache, lengths, ks[:, t:t + 1],
                                              vs[:, t:t + 1])
    as64 = (lambda x: np.asarray(x.astype(jnp.float32), dtype=np.float64))
    ref, _ = _ref(as64(qs[:, -1:]), as64(ks), as64(vs), [steps] * batch, False)
    assert rel_err(as64(out), ref) < (1e-5 if dtype == jnp.float32 else 1e-2)
    np.testing.assert_array_equal(np.asarray(lengths), [steps] * batch)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "mma", "wgmma"])
@pytest.mark.parametrize("page_size", [None, 16, 256], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_chunked_prefill_on_tensor_cores(rng, backend, page_size, head_dim):
    # A prefill chunk of 200 queries appended to caches of different fills, then attending to
    # them (bottom-right causal): the flash paths' sequence layout (seqused_k, paged pages).
    import torch

    if backend != "auto" and backend not in waveboost.info()["backends"]:
        pytest.skip(f"backend {backend!r} is not available on this GPU / build")
    batch, heads, heads_kv, seqlen_q, max_len = 3, 8, 2, 200, 1024
    k_np, v_np = _cache(rng, batch, max_len, heads_kv, head_dim)
    lengths = np.array([0, 77, max_len - seqlen_q - 5], np.int32)
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k_new = torch.randn(batch, seqlen_q, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16)
    v_new = torch.randn(batch, seqlen_q, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.from_numpy(k_np).to("cuda", torch.bfloat16)
    v_cache = torch.from_numpy(v_np).to("cuda", torch.bfloat16)
    if page_size is None:
        k_store, v_store, table = k_cache.clone(), v_cache.clone(), None
    else:
        kp, vp, tb = _paged(rng, k_cache.float().cpu().numpy(), v_cache.float().cpu().numpy(), page_size)
        k_store, v_store = torch.from_numpy(kp).to("cuda", torch.bfloat16), torch.from_numpy(vp).to("cuda", torch.bfloat16)
        table = torch.from_numpy(tb).cuda()
    out = torch.full_like(q, float("nan"))
    waveboost.attention_with_kvcache(q, k_store, v_store, torch.from_numpy(lengths).cuda(), block_table=table,
                                     k_new=k_new, v_new=v_new, causal=True, out=out, backend=backend)
    torch.cuda.synchronize()
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        expected_k[b, n:n + seqlen_q] = k_new[b]
        expected_v[b, n:n + seqlen_q] = v_new[b]
    _half_rule(out, q, expected_k, expected_v, lengths + seqlen_q, True)
