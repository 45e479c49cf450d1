"""Drop-in entry points: torch's SDPA convention (BHSD, top-left causal) and flash-attn's
flash_attn_func (BSHD, bottom-right causal, +inf LSE for a row that sees no key)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reference import attention_ref, max_abs_err, random_qkv

import waveboost

LENGTHS = [(1, 1), (7, 7), (97, 97), (7, 97), (97, 7), (1, 257), (257, 1), (33, 40), (40, 33)]


def top_left_ref(q, k, v, causal, scale=None):
    """SDPA's semantics in float64 on BHSD arrays: query i sees keys j <= i when causal."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if causal:
        lq, lk = s.shape[-2:]
        s = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


# --- waveboost.torch.scaled_dot_product_attention ------------------------------------------------


@pytest.mark.parametrize("lq,lk", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch,heads,heads_kv", [(1, 4, 4), (2, 8, 2), (2, 8, 1)])
def test_sdpa_matches_top_left_reference_and_torch(rng, lq, lk, causal, batch, heads, heads_kv):
    torch = pytest.importorskip("torch", reason="waveboost.torch needs PyTorch")
    import waveboost.torch as wt

    q = torch.from_numpy(rng.standard_normal((batch, heads, lq, 32)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((batch, heads_kv, lk, 32)).astype(np.float32))
    v = torch.from_numpy(rng.standard_normal((batch, heads_kv, lk, 32)).astype(np.float32))
    out = wt.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=heads != heads_kv)
    assert out.shape == (batch, heads, lq, 32) and out.dtype == torch.float32
    ref = top_left_ref(q.numpy(), k.numpy(), v.numpy(), causal)
    assert max_abs_err(out.numpy(), ref) < 1e-5
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=causal, enable_gqa=heads != heads_kv)
    assert max_abs_err(out.numpy(), expected.numpy()) < 1e-5


@pytest.mark.parametrize("lq,lk", [(3, 0), (0, 3), (0, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_empty_sequences_match_torch(lq, lk, causal):
    torch = pytest.importorskip("torch", reason="waveboost.torch needs PyTorch")
    import waveboost.torch as wt

    q, k = torch.randn(1, 2, lq, 8), torch.randn(1, 2, lk, 8)
    out = wt.scaled_dot_product_attention(q, k, k, is_causal=causal)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=causal)
    assert out.shape == expected.shape and torch.equal(out, expected)


def test_sdpa_differs_from_bottom_right_where_lengths_differ(rng):
    # The check above would pass for a wrapper that forgot the convention only if the two masks
    # agreed: show they do not for these lengths, so the comparison has teeth.
    q, k, v = random_qkv(rng, 1, 7, 12, 2, 2, 16)
    bottom_right = attention_ref(q, k, v, causal=True)[0].transpose(0, 2, 1, 3)
    top_left = top_left_ref(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)), causal=True)
    assert max_abs_err(bottom_right, top_left) > 1e-2


def test_sdpa_scale_and_positional_order(rng):
    torch = pytest.importorskip("torch", reason="waveboost.torch needs PyTorch")
    import waveboost.torch as wt

    q, k, v = (torch.from_numpy(rng.standard_normal((2, 4, 9, 16))) for _ in range(3))
    out = wt.scaled_dot_product_attention(q, k, v, None, 0.0, True, 0.3)
    assert max_abs_err(out.numpy(), top_left_ref(q.numpy(), k.numpy(), v.numpy(), True, 0.3)) < 1e-12


def test_sdpa_takes_half_precision_on_the_cpu(rng):
    torch = pytest.importorskip("torch", reason="waveboost.torch needs PyTorch")
    import waveboost.torch as wt

    q, k, v = (torch.from_numpy(rng.standard_normal((2, 4, 33, 64)).astype(np.float32)).half() for _ in range(3))
    out = wt.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == torch.float16
    ref = top_left_ref(q.numpy(), k.numpy(), v.numpy(), True)
    naive = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert max_abs_err(out.float().numpy(), ref) <= 2 * max_abs_err(naive.float().numpy(), ref) + 1e-3


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(attn_mask="mask"), ValueError, r"attn_mask must be None"),
        (dict(dropout_p=0.1), ValueError, r"dropout_p must be 0.0"),
        (dict(dropout_p="0"), TypeError, r"dropout_p must be a float"),
        (dict(is_causal="no"), TypeError, r"is_causal must be a bool; got str"),
        (dict(enable_gqa=1), TypeError, r"enable_gqa must be a bool; got int"),
        (dict(heads_kv=2), ValueError, r"query has 4 heads but key has 2: pass enable_gqa=True"),
        (dict(heads_kv=3, enable_gqa=True), ValueError, r"multiple of k's heads_kv \(3\)"),
        (dict(query_ndim=3), ValueError, r"query must be a 4-D tensor \(batch, heads, seqlen, head_dim\)"),
        (dict(value_dim=8), ValueError, r"value has shape .* but key has"),
        (dict(query_numpy=True), TypeError, r"query must be a torch.Tensor"),
    ],
)
def test_sdpa_refuses_what_it_cannot_do(rng, kwargs, error, match):
    torch = pytest.importorskip("torch", reason="waveboost.torch needs PyTorch")
    import waveboost.torch as wt

    heads_kv = kwargs.pop("heads_kv", 4)
    q = torch.randn(2, 4, 9, 16)
    k, v = torch.randn(2, heads_kv, 9, 16), torch.randn(2, heads_kv, 9, 16)
    if kwargs.pop("query_ndim", 4) == 3:
        q = q[0]
    if kwargs.pop("value_dim", None):
        v = v[..., :8]
    if kwargs.pop("query_numpy", False):
        q = q.numpy()
    with pytest.raises(error, match=match):
        wt.scaled_dot_product_attention(q, k, v, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("lq,lk", [(128, 128), (100, 300), (300, 100)])
def test_sdpa_on_gpu_matches_torch(rng, lq, lk):
    import torch

    import waveboost.torch as wt

    q = torch.randn(2, 8, lq, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 2, lk, 64, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    out = wt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref = top_left_ref(q.cpu().float().numpy(), k.cpu().float().numpy(), v.cpu().float().numpy(), True)
    naive = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert max_abs_err(out.float().cpu().numpy(), ref) <= 2 * max_abs_err(naive.float().cpu().numpy(), ref) + 1e-3


# --- waveboost.flash_attn_func -------------------------------------------------------------------


@pytest.mark.parametrize("lq,lk", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_func_matches_reference(rng, lq, lk, causal):
    q, k, v = random_qkv(rng, 2, lq, lk, 8, 2, 32)
    out = waveboost.flash_attn_func(q, k, v, 0.0, 0.25, causal)
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal, softmax_scale=0.25)
    assert max_abs_err(out, ref_out) < 1e-5
    result = waveboost.flash_attn_func(q, k, v, softmax_scale=0.25, causal=causal, return_attn_probs=True)
    assert isinstance(result, tuple) and len(result) == 3 and result[2] is None
    out, lse, _ = result
    assert max_abs_err(out, ref_out) < 1e-5
    no_key = np.isneginf(ref_lse)
    assert np.all(np.isposinf(lse[no_key])), "flash-attn reports +inf for a row that sees no key"
    assert np.all(out.transpose(0, 2, 1, 3)[no_key] == 0)
    assert max_abs_err(lse[~no_key], ref_lse[~no_key]) < 1e-5
    assert no_key.any() == (causal and lq > lk)


@pytest.mark.gpu
def test_flash_attn_func_on_gpu_keeps_flash_attn_conventions():
    import torch

    q = torch.randn(2, 300, 8, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 100, 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    out, lse, mask = waveboost.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert mask is None and out.dtype == torch.float16 and lse.dtype == torch.float32 and lse.shape == (2, 8, 300)
    q64, k64, v64 = (t.float().cpu().numpy() for t in (q, k, v))
    ref_out, ref_lse = attention_ref(q64, k64, v64, causal=True)
    naive = attention_ref(q64, k64, v64, causal=True, dtype=np.float16)[0]
    assert max_abs_err(out.float().cpu().numpy(), ref_out) <= 2 * max_abs_err(naive, ref_out) + 1e-3
    no_key = np.isneginf(ref_lse)  # bottom-right: the first 200 queries see no key
    got = lse.cpu().numpy()
    assert no_key.any() and np.all(np.isposinf(got[no_key]))
    assert max_abs_err(got[~no_key], ref_lse[~no_key]) < 1e-2


def test_flash_attn_func_lse_in_torch_and_jax(rng):
    q, k, v = random_qkv(rng, 1, 9, 4, 2, 2, 16)
    expected = np.isneginf(attention_ref(q, k, v, causal=True)[1])
    for name in ("torch", "jax.numpy"):
        xp = pytest.importorskip(name, reason=f"the {name} round needs {name}")
        args = [xp.asarray(x) for x in (q, k, v)]
        _, lse, _ = waveboost.flash_attn_func(*args, causal=True, return_attn_probs=True)
        assert np.array_equal(np.isposinf(np.asarray(lse)), expected)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(dropout_p=0.1), ValueError, r"dropout_p must be 0.0"),
        (dict(window_size=(128, 0)), ValueError, r"window_size must be \(-1, -1\)"),
        (dict(window_size=None), TypeError, r"window_size must be a pair of ints"),
        (dict(softcap=30.0), ValueError, r"softcap must be 0.0"),
        (dict(alibi_slopes=np.ones(4, np.float32)), ValueError, r"alibi_slopes must be None"),
        (dict(causal="yes"), TypeError, r"causal must be a bool; got str"),
        (dict(deterministic=None), TypeError, r"deterministic must be a bool"),
        (dict(return_attn_probs=1), TypeError, r"return_attn_probs must be a bool"),
    ],
)
def test_flash_attn_func_refuses_unsupported_features_by_name(rng, kwargs, error, match):
    q, k, v = random_qkv(rng, 1, 8, 8, 4, 4, 16)
    with pytest.raises(error, match=match):
        waveboost.flash_attn_func(q, k, v, **kwargs)


def test_flash_attn_func_accepts_deterministic(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 4, 4, 16)
    assert np.array_equal(waveboost.flash_attn_func(q, k, v, deterministic=True), waveboost.attention(q, k, v))


def test_sdpa_compiles_fullgraph_on_the_cpu(rng):
    torch = pytest.importorskip("torch", reason="waveboost.torch needs PyTorch")
    import waveboost.torch as wt

    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: wt.scaled_dot_product_attention(q, k, v, is_causal=True),
                             fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    for lq, lk in ((9, 9), (5, 9), (9, 5)):  # the three rewrites: plain, first keys, two calls
        q = torch.from_numpy(rng.standard_normal((1, 2, lq, 16)).astype(np.float32))
        k = torch.from_numpy(rng.standard_normal((1, 2, lk, 16)).astype(np.float32))
        out = compiled(q, k, k)
        assert max_abs_err(out.numpy(), top_left_ref(q.numpy(), k.numpy(), k.numpy(), True)) < 1e-5


def test_flash_attn_func_under_jax_jit(rng):
    jax = pytest.importorskip("jax", reason="the JAX round needs jax")
    import waveboost.jax as wj

    if not wj.ffi_available():
        pytest.skip("this build has no XLA FFI handlers: JAX arrays run eagerly only")
    q, k, v = random_qkv(rng, 1, 9, 4, 2, 2, 16)
    fn = jax.jit(lambda q, k, v: waveboost.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[:2])
    out, lse = fn(*(jax.numpy.asarray(x) for x in (q, k, v)))
    ref_out, ref_lse = attention_ref(q, k, v, causal=True)
    no_key = np.isneginf(ref_lse)
    assert np.all(np.isposinf(np.asarray(lse)[no_key])) and max_abs_err(np.asarray(out), ref_out) < 1e-5
