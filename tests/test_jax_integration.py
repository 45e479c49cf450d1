"""waveboost.jax: the XLA FFI custom call under jax.jit and jax.vmap, against JAX's own reference.

The reference is plain softmax attention in jnp, computed in float32 at full matmul precision.
CPU tests run wherever jax is installed and waveboost was built with the FFI handlers; GPU tests
run the CUDA handler on XLA's stream.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="waveboost.jax needs JAX")
jnp = jax.numpy

import waveboost
import waveboost.jax as wbj

needs_ffi = pytest.mark.skipif(
    not wbj.ffi_available(), reason="waveboost was built without the XLA FFI handlers (no jaxlib at build time)"
)


def jax_reference(q, k, v, causal=False, softmax_scale=None, dtype=jnp.float32):
    """softmax(scale q k^T) v in `dtype` with JAX; BSHD; returns (out, lse (B, H, Lq)).

    float32 is the reference; the input dtype gives the plain same-dtype implementation whose
    error bounds what a half-precision kernel may have (FlashAttention's rule).
    """
    _b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    k = jnp.repeat(k, h // hkv, axis=2)
    v = jnp.repeat(v, h // hkv, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=jax.lax.Precision.HIGHEST) * jnp.asarray(scale, dtype)
    if causal:
        visible = jnp.arange(lk)[None, :] <= jnp.arange(lq)[:, None] + (lk - lq)
        s = jnp.where(visible, s, -jnp.inf)
    lse = jax.nn.logsumexp(s.astype(jnp.float32), axis=-1)
    p = jnp.nan_to_num(jax.nn.softmax(s, axis=-1), nan=0.0)  # a row with no visible key: p = 0
    out = jnp.einsum("bhqk,bkhd->bqhd", p, v, precision=jax.lax.Precision.HIGHEST)
    return out, lse


def random_qkv(key, b, lq, lk, h, hkv, d, dtype=jnp.float32, device=None):
    """Fresh normal q, k, v committed to `device` (JAX's CPU by default, whatever the default device)."""
    device = device or jax.devices("cpu")[0]
    kq, kk, kv = jax.random.split(key, 3)
    shapes = ((b, lq, h, d), (b, lk, hkv, d), (b, lk, hkv, d))
    return tuple(jax.device_put(jax.random.normal(key, s, jnp.float32).astype(dtype), device)
                 for key, s in zip((kq, kk, kv), shapes))


def check(out, lse, q, k, v, causal, softmax_scale=None, atol=None):
    """fp32: relative error 1e-5; half precision: at most twice the same-dtype naive error + atol."""
    ref, ref_lse = jax_reference(q, k, v, causal, softmax_scale)
    out32 = np.asarray(out.astype(jnp.float32))
    ref = np.asarray(ref)
    assert not np.isnan(out32).any()
    if q.dtype == jnp.float32:
        assert np.linalg.norm(out32 - ref) <= 1e-5 * max(np.linalg.norm(ref), 1e-30)
    else:
        naive, _ = jax_reference(q, k, v, causal, softmax_scale, dtype=q.dtype)
        naive_err = np.abs(np.asarray(naive.astype(jnp.float32)) - ref).max()
        assert np.abs(out32 - ref).max() <= 2 * naive_err + atol
    lse, ref_lse = np.asarray(lse), np.asarray(ref_lse)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    lse_tol = 1e-4 if q.dtype == jnp.float32 else 1e-3
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=lse_tol, atol=lse_tol)


# ---------------------------------------------------------------------------------------------
# CPU handler
# ---------------------------------------------------------------------------------------------

@needs_ffi
@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_jit_matches_jax_reference_cpu(causal, group):
    q, k, v = random_qkv(jax.random.key(group), 2, 37, 53 if causal else 29, 8, 8 // group, 32)
    fn = jax.jit(lambda q, k, v: wbj.attention(q, k, v, causal=causal, return_lse=True))
    out, lse = fn(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (2, 8, 37) and lse.dtype == jnp.float32
    check(out, lse, q, k, v, causal)


@needs_ffi
def test_causal_rows_with_no_key_and_scale_cpu():
    q, k, v = random_qkv(jax.random.key(7), 1, 40, 3, 4, 2, 16)  # seqlen_q > seqlen_k: early rows see nothing
    out, lse = jax.jit(lambda q, k, v: wbj.attention(q, k, v, causal=True, softmax_scale=0.3, return_lse=True))(q, k, v)
    check(out, lse, q, k, v, True, softmax_scale=0.3)
    assert np.all(np.asarray(out)[:, :37] == 0) and np.all(np.isneginf(np.asarray(lse)[:, :, :37]))


@needs_ffi
def test_vmap_matches_jax_reference_cpu():
    q, k, v = random_qkv(jax.random.key(1), 2, 19, 23, 4, 2, 16)
    qs = jnp.stack([q, 0.5 * q, 2.0 * q])
    # Only q mapped: k and v are shared across the mapped axis.
    out, lse = jax.jit(jax.vmap(lambda q: wbj.attention(q, k, v, causal=True, return_lse=True)))(qs)
    assert out.shape == (3, 2, 19, 4, 16) and lse.shape == (3, 2, 4, 19)
    for i in range(3):
        check(out[i], lse[i], qs[i], k, v, True)
    # Every operand mapped, along different axes, and a vmap nested in another.
    ks = jnp.stack([k, -k, 3.0 * k], axis=1)
    vs = jnp.stack([v, v * v, -v], axis=4)
    out, lse = jax.vmap(lambda q, k, v: wbj.attention(q, k, v, return_lse=True), in_axes=(0, 1, 4))(qs, ks, vs)
    for i in range(3):
        check(out[i], lse[i], qs[i], ks[:, i], vs[..., i], False)
    nested = jax.vmap(jax.vmap(lambda q: wbj.attention(q, k, v)))(jnp.stack([qs, -qs]))
    np.testing.assert_array_equal(np.asarray(nested[0]), np.asarray(jax.vmap(lambda q: wbj.attention(q, k, v))(qs)))


@needs_ffi
def test_waveboost_attention_routes_jax_arrays_through_the_ffi_cpu():
    q, k, v = random_qkv(jax.random.key(2), 1, 17, 17, 4, 1, 8)
    eager = waveboost.attention(q, k, v, causal=True)
    assert isinstance(eager, jax.Array)
    # Only the FFI route can run under jit: the DLPack route needs concrete arrays.
    jitted = jax.jit(lambda q, k, v: waveboost.attention(q, k, v, causal=True))(q, k, v)
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(wbj.attention(q, k, v, causal=True)))


@needs_ffi
def test_trace_time_errors():
    q, k, v = random_qkv(jax.random.key(3), 1, 8, 8, 4, 2, 16)
    with pytest.raises(ValueError, match=r"q must be a 4-D array"):
        wbj.attention(q[0], k, v)
    with pytest.raises(TypeError, match=r"k has dtype float16 but q has float32"):
        wbj.attention(q, k.astype(jnp.float16), v)
    with pytest.raises(ValueError, match=r"q's heads \(4\) must be a multiple of k's heads_kv \(3\)"):
        wbj.attention(q, jnp.zeros((1, 8, 3, 16)), jnp.zeros((1, 8, 3, 16)))
    with pytest.raises(ValueError, match=r"backend must be one of"):
        wbj.attention(q, k, v, backend="flash")
    with pytest.raises(ValueError, match=r"softmax_scale must be a finite number"):
        wbj.attention(q, k, v, softmax_scale=float("nan"))


@needs_ffi
def test_handler_errors_carry_waveboosts_message():
    q, k, v = random_qkv(jax.random.key(4), 1, 8, 8, 2, 2, 16)
    with pytest.raises(Exception, match=r"backend 'wmma' runs on CUDA tensors"):
        jax.block_until_ready(wbj.attention(q, k, v, backend="wmma"))


def test_missing_ffi_raises_and_eager_falls_back_to_dlpack(monkeypatch):
    q, k, v = random_qkv(jax.random.key(5), 1, 9, 9, 2, 1, 8)
    monkeypatch.setattr(wbj, "_registered_platforms", lambda: ())
    assert not wbj.ffi_available()
    with pytest.raises(RuntimeError, match=r"no-build-isolation"):
        wbj.attention(q, k, v)
    with pytest.raises(RuntimeError, match=r"no-build-isolation"):  # the DLPack route cannot run traced
        jax.jit(lambda q, k, v: waveboost.attention(q, k, v))(q, k, v)
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(out, jax.Array)
    check(out, lse, q, k, v, True)


def test_out_argument_needs_concrete_arrays():
    q, k, v = random_qkv(jax.random.key(6), 1, 9, 9, 2, 1, 8)
    with pytest.raises(TypeError, match=r"out= needs concrete JAX arrays"):
        jax.jit(lambda q, k, v: waveboost.attention(q, k, v, out=jnp.empty_like(q)))(q, k, v)


# FP8 (float8_e4m3fn) runs on Hopper only (tests/test_fp8_gpu.py); here, what the CPU can show: the
# traced call's results, the trace-time refusals and the handler's dtype mapping.

def _fp8_qkv(seed, b=2, lq=9, lk=11, h=4, hkv=2):
    return tuple(x.astype(jnp.float8_e4m3fn) for x in random_qkv(jax.random.key(seed), b, lq, lk, h, hkv, 128))


@needs_ffi
def test_fp8_traces_to_a_bfloat16_custom_call_cpu():
    q, k, v = _fp8_qkv(13)
    sk = jnp.full((2, 2), 0.5, jnp.float32)
    for route in (wbj.attention, waveboost.attention):
        fn = jax.jit(lambda q, k, v, sk: route(q, k, v, causal=True, return_lse=True, q_descale=2.0, k_descale=sk,
                                               v_descale=jnp.float32(0.25)))
        out, lse = jax.eval_shape(fn, q, k, v, sk)  # traced and shaped, nothing runs
        assert (out.shape, out.dtype) == (q.shape, jnp.bfloat16)
        assert (lse.shape, lse.dtype) == ((2, 4, 9), jnp.float32)
        assert "waveboost_attention" in fn.lower(q, k, v, sk).as_text()
    # vmap: the descales (unmapped here) are broadcast along the mapped axis like k and v.
    out = jax.eval_shape(jax.vmap(lambda q: wbj.attention(q, k, v, k_descale=sk)), jnp.stack([q, q, q]))
    assert (out.shape, out.dtype) == ((3,) + q.shape, jnp.bfloat16)


@needs_ffi
def test_fp8_handler_takes_e4m3_buffers_and_says_why_the_cpu_cannot_run_them():
    q, k, v = _fp8_qkv(14)
    # The dtype reaches the C++ checks as float8_e4m3fn (not an opaque byte type) and the cpu
    # backend refuses it by name, through XLA.
    refusal = r"backend 'cpu' supports float32 and float64 on the CPU; got float8_e4m3fn"
    with pytest.raises(Exception, match=refusal):
        jax.block_until_ready(jax.jit(lambda q, k, v: wbj.attention(q, k, v, v_descale=0.5))(q, k, v))
    # Under vmap the descales' leading axes fold into batch like q's: the params builder accepts them
    # (its shape checks come before the backend's refusal), mapped or broadcast.
    qs, sk = jnp.stack([q, q, q]), jnp.ones((2, 2), jnp.float32)
    with pytest.raises(Exception, match=refusal):
        jax.block_until_ready(jax.vmap(lambda q, s: wbj.attention(q, k, v, q_descale=0.5, k_descale=s))(
            qs, jnp.stack([sk, sk, sk])))
    with pytest.raises(Exception, match=refusal):
        jax.block_until_ready(jax.vmap(lambda q: wbj.attention(q, k, v, k_descale=sk))(qs))


@needs_ffi
def test_fp8_trace_time_errors_name_the_argument():
    q, k, v = _fp8_qkv(15)
    q32 = q.astype(jnp.float32)

    def trace(*args, route=wbj.attention, **kwargs):
        return jax.eval_shape(lambda *a: route(*a, **kwargs), *args)

    for route in (wbj.attention, waveboost.attention):
        with pytest.raises(ValueError, match=r"q_descale, k_descale and v_descale apply to float8_e4m3fn inputs; "
                                             r"q has dtype float32"):
            trace(q32, k.astype(jnp.float32), v.astype(jnp.float32), route=route, k_descale=2.0)
        with pytest.raises(ValueError, match=r"q_descale must have shape \(batch, heads_kv\) = \(2, 2\) or one "
                                             r"element; got shape \(2, 4\)"):
            trace(q, k, v, route=route, q_descale=jnp.ones((2, 4), jnp.float32))
    with pytest.raises(ValueError, match=r"v_descale must have shape .* got shape \(3, 2\)"):  # a traced descale
        trace(q, k, v, jnp.ones((3, 2), jnp.float32), route=lambda q, k, v, s: wbj.attention(q, k, v, v_descale=s))
    with pytest.raises(TypeError, match=r"k_descale must have dtype float32; got float16"):
        trace(q, k, v, k_descale=jnp.ones((2, 2), jnp.float16))
    with pytest.raises(TypeError, match=r"v_descale must be a float or a float32 jax array like q; got numpy.ndarray"):
        trace(q, k, v, v_descale=np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match=r"q_descale must be a float or a float32 jax array like q; got builtins.list"):
        trace(q, k, v, q_descale=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"k_descale must be finite; got inf"):
        trace(q, k, v, k_descale=float("inf"))
    with pytest.raises(TypeError, match=r"k has dtype bfloat16 but q has float8_e4m3fn"):
        trace(q, k.astype(jnp.bfloat16), v)
    with pytest.raises(ValueError, match=r"float8_e4m3fn q, k, v run on the 'wgmma' backend .* got backend 'mma'"):
        trace(q, k, v, backend="mma")
    with pytest.raises(TypeError, match=r"q must have dtype float16, bfloat16, float32 or float64; got float8_e5m2"):
        trace(*(x.astype(jnp.float8_e5m2) for x in (q, k, v)))


@needs_ffi
def test_fp8_has_no_gradient_cpu():
    q, k, v = _fp8_qkv(16)
    message = r"float8_e4m3fn attention has no backward pass"
    # Through the quantization of a float input, and with respect to a descale factor.
    loss = lambda x: wbj.attention(x.astype(jnp.float8_e4m3fn), k, v).astype(jnp.float32).sum()  # noqa: E731
    with pytest.raises(NotImplementedError, match=message):
        jax.eval_shape(jax.grad(loss), q.astype(jnp.float32))
    loss = lambda s: waveboost.attention(q, k, v, v_descale=s).astype(jnp.float32).sum()  # noqa: E731
    with pytest.raises(NotImplementedError, match=message):
        jax.eval_shape(jax.jit(jax.grad(loss)), jnp.ones((2, 2), jnp.float32))
    # The non-FP8 call keeps its gradient.
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    grad = jax.grad(lambda q: wbj.attention(q, k32, v32).sum())(q32)
    assert grad.shape == q32.shape and bool(jnp.isfinite(grad).all())


# ---------------------------------------------------------------------------------------------
# CUDA handler (XLA's stream, XLA's allocations)
# ---------------------------------------------------------------------------------------------

def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


@pytest.fixture
def gpu():
    """JAX's first GPU; asked at run time so that collecting this file starts no GPU backend."""
    gpus = _gpus()
    if not gpus:
        pytest.skip("JAX sees no GPU")
    return gpus[0]


DTYPES = {"fp16": jnp.float16, "bf16": jnp.bfloat16, "fp32": jnp.float32}
ATOL = {"fp16": 2e-4, "bf16": 2e-3, "fp32": None}
# wmma, wgmma and decode are half-precision paths by design; their fp32 refusal is tested in test_gpu.py
# and test_decode_gpu.py.
GPU_CASES = [(p, n, d) for p in waveboost.BACKENDS if p != "cpu" for n in DTYPES for d in (64, 128)
             if not (p in ("wmma", "wgmma", "decode") and n == "fp32")]


@pytest.mark.gpu
@needs_ffi
@pytest.mark.parametrize("backend,dname,d", GPU_CASES, ids=[f"{p}-{n}-d{d}" for p, n, d in GPU_CASES])
def test_jit_matches_jax_reference_gpu(gpu, backend, dname, d):
    q, k, v = random_qkv(jax.random.key(d), 2, 257, 97, 8, 2, d, DTYPES[dname], device=gpu)
    try:
        waveboost.resolve_backend(q, k, v, backend=backend)
    except ValueError as e:  # only the GPU's compute capability can refuse these cases
        pytest.skip(f"backend {backend!r} cannot run on this GPU: {e}")
    for causal in (False, True):
        fn = jax.jit(functools.partial(wbj.attention, causal=causal, return_lse=True, backend=backend))
        out, lse = fn(q, k, v)
        assert out.devices() == q.devices()
        check(out, lse, q, k, v, causal, atol=ATOL[dname])


@pytest.mark.gpu
@needs_ffi
@pytest.mark.parametrize("dname", ["fp16", "bf16", "fp32"])
def test_vmap_matches_jax_reference_gpu(gpu, dname):
    q, k, v = random_qkv(jax.random.key(9), 2, 130, 200, 8, 1, 128, DTYPES[dname], device=gpu)
    qs = jnp.stack([q, -q, q * 0.5, q * 2])
    out, lse = jax.jit(jax.vmap(lambda q: wbj.attention(q, k, v, causal=True, return_lse=True)))(qs)
    for i in range(qs.shape[0]):
        check(out[i], lse[i], qs[i], k, v, True, atol=ATOL[dname])


@pytest.mark.gpu
@needs_ffi
def test_eager_and_jit_inside_a_larger_program_gpu(gpu):
    q, k, v = random_qkv(jax.random.key(11), 2, 150, 90, 4, 2, 128, jnp.bfloat16, device=gpu)
    out = waveboost.attention(q, k, v, causal=True)  # eager: the same FFI route
    assert isinstance(out, jax.Array) and out.dtype == jnp.bfloat16

    @jax.jit
    def program(q, k, v):  # XLA orders our kernel between its own ops on its stream
        q = q * 2
        return jnp.sum(wbj.attention(q, k, v, causal=True).astype(jnp.float32) ** 2)

    expected = jnp.sum(jax_reference(q * 2, k, v, True)[0] ** 2)
    np.testing.assert_allclose(float(program(q, k, v)), float(expected), rtol=2e-2)


@pytest.mark.gpu
@needs_ffi
def test_second_gpu_gets_its_own_device_ordinal():
    gpus = _gpus()
    if len(gpus) < 2:
        pytest.skip("needs a second GPU visible to JAX")
    q, k, v = random_qkv(jax.random.key(12), 2, 100, 120, 8, 2, 64, jnp.float16, device=gpus[1])
    out, lse = jax.jit(lambda q, k, v: wbj.attention(q, k, v, causal=True, return_lse=True))(q, k, v)
    assert out.devices() == {gpus[1]}
    check(out, lse, q, k, v, True, atol=ATOL["fp16"])
