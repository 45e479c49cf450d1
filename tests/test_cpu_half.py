"""float16 and bfloat16 host arrays (NumPy, ml_dtypes' bfloat16, PyTorch CPU) run on the cpu
backend, computed in float32 as torch's CPU SDPA does, and come back in their own dtype."""

from __future__ import annotations

import numpy as np
import pytest
from reference import attention_ref, max_abs_err, random_qkv

import waveboost

SIZES = [(1, 1, 1, 1), (2, 7, 97, 2), (1, 97, 7, 8), (2, 257, 257, 1)]  # batch, lq, lk, group


def _half_dtypes():
    dtypes = [pytest.param(np.float16, id="float16")]
    try:
        import ml_dtypes

        dtypes.append(pytest.param(ml_dtypes.bfloat16, id="bfloat16"))
    except ImportError:
        dtypes.append(pytest.param(None, id="bfloat16", marks=pytest.mark.skip(reason="ml_dtypes not installed")))
    return dtypes


@pytest.mark.parametrize("dtype", _half_dtypes())
@pytest.mark.parametrize("batch,lq,lk,group", SIZES)
@pytest.mark.parametrize("causal", [False, True])
def test_numpy_half_within_twice_same_dtype_naive(rng, dtype, batch, lq, lk, group, causal):
    q, k, v = random_qkv(rng, batch, lq, lk, 8, 8 // group, 64)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.dtype == np.float32
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal)
    # The plain same-dtype implementation: scores and softmax in the half dtype, as a naive kernel would.
    naive = attention_ref(q, k, v, causal=causal, dtype=np.float16)[0] if dtype is np.float16 else (
        attention_ref(q, k, v, causal=causal, dtype=np.float32)[0].astype(dtype))
    assert max_abs_err(out, ref_out) <= 2 * max_abs_err(naive, ref_out) + 1e-3
    finite = np.isfinite(ref_lse)
    assert max_abs_err(lse[finite], ref_lse[finite]) < 1e-4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_cpu_half_matches_torch_sdpa(rng, dtype):
    torch = pytest.importorskip("torch", reason="the PyTorch round needs PyTorch")
    q, k, v = (torch.from_numpy(x).to(getattr(torch, dtype)) for x in random_qkv(rng, 2, 97, 33, 8, 2, 64))
    out = waveboost.attention(q, k, v, causal=True)
    assert out.dtype == q.dtype
    ref = attention_ref(*(x.float().numpy() for x in (q, k, v)), causal=True)[0]
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=False,
        attn_mask=torch.from_numpy(np.tril(np.ones((97, 33), bool), 33 - 97)), enable_gqa=True).transpose(1, 2)
    assert max_abs_err(out.float().numpy(), ref) <= 2 * max_abs_err(sdpa.float().numpy(), ref) + 1e-3


def test_half_out_is_written_in_place(rng):
    q, k, v = (x.astype(np.float16) for x in random_qkv(rng, 1, 9, 9, 2, 2, 16))
    dest = np.full_like(q, np.nan)
    result = waveboost.attention(q, k, v, out=dest)
    assert result is dest and not np.isnan(dest).any()
    assert max_abs_err(dest, attention_ref(q, k, v)[0]) < 2e-3


def test_half_mistakes_still_raise(rng):
    q, k, v = (x.astype(np.float16) for x in random_qkv(rng, 1, 9, 9, 2, 2, 16))
    with pytest.raises(TypeError, match=r"k has dtype float32 but q has float16"):
        waveboost.attention(q, k.astype(np.float32), v)
    with pytest.raises(ValueError, match=r"out has shape \(1, 8, 2, 16\) but q has \(1, 9, 2, 16\)"):
        waveboost.attention(q, k, v, out=np.empty((1, 8, 2, 16), np.float16))
    with pytest.raises(ValueError, match=r"backend 'naive'"):
        waveboost.attention(q, k, v, backend="naive")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_eager_jax_cpu_half(rng, dtype):
    jnp = pytest.importorskip("jax.numpy", reason="the JAX round needs jax")
    q, k, v = random_qkv(rng, 2, 33, 21, 4, 2, 32)
    args = [jnp.asarray(x).astype(dtype) for x in (q, k, v)]
    out, lse = waveboost.attention(*args, causal=True, return_lse=True)
    assert out.dtype == jnp.dtype(dtype) and lse.dtype == jnp.float32
    ref_out, ref_lse = attention_ref(*(np.asarray(x, np.float32) for x in args), causal=True)
    naive = attention_ref(*(np.asarray(x, np.float32) for x in args), causal=True, dtype=np.float32)[0]
    naive = np.asarray(jnp.asarray(naive).astype(dtype), np.float32)  # fp32 math, rounded once to the half dtype
    assert max_abs_err(np.asarray(out, np.float32), ref_out) <= 2 * max_abs_err(naive, ref_out) + 1e-3
    finite = np.isfinite(ref_lse)
    assert max_abs_err(np.asarray(lse)[finite], ref_lse[finite]) < 1e-4
