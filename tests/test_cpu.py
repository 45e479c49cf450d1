"""The CPU path against the float64 reference, on the DESIGN.md matrix of awkward sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest

import waveboost
from reference import attention_ref, random_qkv, rel_err

# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim)
SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 7, 7, 4, 2, 64),
    (1, 97, 97, 8, 1, 128),
    (2, 257, 257, 2, 2, 80),
    (1, 1025, 1025, 2, 1, 64),
    (1, 97, 257, 8, 8, 32),  # seqlen_q < seqlen_k
    (2, 257, 97, 4, 2, 128),  # seqlen_q > seqlen_k: causal leaves rows with no key
    (1, 1, 1025, 8, 2, 128),  # decode-like
    (3, 7, 1, 2, 1, 3),  # odd head dim, single key
]
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def _ids(shape):
    return "B{}-Lq{}-Lk{}-H{}-Hkv{}-D{}".format(*shape)


def _check(out, lse, q, k, v, causal, scale, dtype):
    ref, ref_lse = attention_ref(q, k, v, causal=causal, softmax_scale=scale)
    assert not np.isnan(out).any(), "unwritten (NaN-poisoned) or NaN output elements"
    assert rel_err(out, ref) < TOL[dtype]
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "rows with no visible key must have LSE -inf"
    finite = np.isfinite(ref_lse)
    lse_tol = max(TOL[dtype], 1e-6)  # LSE is float32 whatever the input dtype
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=lse_tol, atol=lse_tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_cpu_matches_reference(rng, shape, causal, dtype):
    b, lq, lk, h, hkv, d = shape
    q, k, v = random_qkv(rng, b, lq, lk, h, hkv, d, dtype)
    out = np.full_like(q, np.nan)
    res, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend="cpu")
    assert res is out and res.dtype == dtype and lse.dtype == np.float32 and lse.shape == (b, h, lq)
    _check(out, lse, q, k, v, causal, 1 / math.sqrt(d), dtype)


def test_auto_on_numpy_is_cpu(rng):
    q, k, v = random_qkv(rng, 1, 5, 5, 2, 2, 16)
    assert waveboost.resolve_backend(q, k, v) == "cpu"
    np.testing.assert_array_equal(waveboost.attention(q, k, v), waveboost.attention(q, k, v, backend="cpu"))


def test_custom_softmax_scale(rng):
    q, k, v = random_qkv(rng, 2, 33, 40, 4, 2, 64)
    out, lse = waveboost.attention(q, k, v, softmax_scale=0.37, return_lse=True)
    _check(out, lse, q, k, v, False, 0.37, np.float32)


def test_causal_bottom_right_alignment(rng):
    # Lq < Lk: the last query row sees every key; query 0 sees keys 0..Lk-Lq.
    q, k, v = random_qkv(rng, 1, 3, 8, 1, 1, 16, np.float64)
    out = waveboost.attention(q, k, v, causal=True)
    for i in range(3):
        visible = i + 8 - 3 + 1
        ref, _ = attention_ref(q[:, i : i + 1], k[:, :visible], v[:, :visible])
        np.testing.assert_allclose(out[:, i : i + 1], ref, rtol=1e-12, atol=1e-12)


def test_rows_that_see_no_key_are_zero_with_lse_minus_inf(rng):
    q, k, v = random_qkv(rng, 2, 9, 4, 2, 1, 32)
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True)
    # Query i sees keys j <= i + 4 - 9: rows 0..4 see nothing.
    assert np.all(out[:, :5] == 0) and np.all(np.isneginf(lse[:, :, :5]))
    assert np.all(np.isfinite(lse[:, :, 5:]))
    assert not np.isnan(out).any()


@pytest.mark.parametrize("lq,lk", [(0, 5), (5, 0), (0, 0)])
def test_empty_sequences(rng, lq, lk):
    q, k, v = random_qkv(rng, 2, lq, lk, 2, 2, 8)
    out, lse = waveboost.attention(q, k, v, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 2, lq)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_batch_zero(rng):
    q, k, v = random_qkv(rng, 0, 4, 4, 2, 2, 8)
    assert waveboost.attention(q, k, v).shape == (0, 4, 2, 8)


def test_strided_views(rng):
    # BHSD storage passed as BSHD views (no copies), and a view that skips every other key.
    b, h, hkv, lq, lk, d = 2, 4, 2, 33, 70, 64
    qs = rng.standard_normal((b, h, lq, d)).astype(np.float32)
    ks = rng.standard_normal((b, hkv, lk, d)).astype(np.float32)
    vs = rng.standard_normal((b, hkv, lk, d)).astype(np.float32)
    q, k, v = qs.transpose(0, 2, 1, 3), ks.transpose(0, 2, 1, 3)[:, ::2], vs.transpose(0, 2, 1, 3)[:, ::2]
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    out_storage = np.full((b, h, lq, d), np.nan, np.float32)
    out = out_storage.transpose(0, 2, 1, 3)
    for causal in (False, True):
        waveboost.attention(q, k, v, causal=causal, out=out)
        ref, _ = attention_ref(q, k, v, causal=causal)
        assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("d", [64, 36])
def test_strided_views_long_queries(rng, d):
    # Enough query rows that the AVX2 path packs K and V first: at D = 64 K as K^T panels for the
    # fp32 rows kernel (V rows laid out as its V tile), at D = 36 K and V rows for the transposed
    # kernel (V copied per tile); keys read through a view that skips every other row, and a
    # BHSD-stored query.
    b, h, hkv, lq, lk = 2, 4, 2, 300, 140
    qs = rng.standard_normal((b, h, lq, d)).astype(np.float32)
    ks = rng.standard_normal((b, 2 * lk, hkv, d)).astype(np.float32)
    vs = rng.standard_normal((b, 2 * lk, hkv, d)).astype(np.float32)
    q, k, v = qs.transpose(0, 2, 1, 3), ks[:, ::2], vs[:, ::2]
    assert not k.flags.c_contiguous
    for causal in (False, True):
        out = np.full((b, lq, h, d), np.nan, np.float32)
        _, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend="cpu")
        _check(out, lse, q, k, v, causal, 1 / math.sqrt(d), np.float32)


def test_read_only_inputs(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16)
    for x in (q, k, v):
        x.flags.writeable = False
    ref, _ = attention_ref(q, k, v)
    assert rel_err(waveboost.attention(q, k, v), ref) < 1e-5


def test_deterministic(rng):
    q, k, v = random_qkv(rng, 2, 300, 300, 4, 2, 64)
    first = waveboost.attention(q, k, v, causal=True)
    for _ in range(3):
        np.testing.assert_array_equal(waveboost.attention(q, k, v, causal=True), first)


def test_scores_beyond_2_to_22_on_the_packed_path(rng):
    # Long queries take the AVX2 fp32 rows kernel, whose exponentials fold a row's integer reference
    # (its running max rounded up) into a rounding constant, exact only below 2^22; larger scores
    # (base 2) subtract it instead. Query i is a scaled copy of a key j <= i (visible when causal),
    # which then dominates by ~1e7, so the result is well conditioned: that key's value row and
    # LSE = its score.
    b, lq, lk, h, d = 1, 300, 300, 2, 64
    q, k, v = random_qkv(rng, b, lq, lk, h, h, d)
    q = 1e6 * k[:, [rng.integers(0, i + 1) for i in range(lq)]]
    for causal in (False, True):
        out = np.full_like(q, np.nan)
        _, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend="cpu")
        ref, ref_lse = attention_ref(q, k, v, causal=causal)
        assert np.abs(ref_lse).max() * math.log2(math.e) > 2**22
        assert np.all(np.isfinite(out)) and rel_err(out, ref) < 1e-5
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)


def test_large_scores_do_not_overflow(rng):
    q, k, v = random_qkv(rng, 1, 64, 64, 2, 2, 64)
    out, lse = waveboost.attention(q * 30, k * 30, v, return_lse=True)  # scores of magnitude ~1e3-1e4
    ref, ref_lse = attention_ref(q * 30, k * 30, v)
    assert np.all(np.isfinite(out)) and rel_err(out, ref) < 1e-4
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
