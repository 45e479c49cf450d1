"""The backward pass (waveboost.attention_backward) against the float64 reference backward.

CPU: fp32 Frobenius relative error < 1e-5 per gradient, fp64 < 1e-12, on awkward sizes, GQA/MQA,
causal with seqlen_q != seqlen_k, strided views, unusual scales, with and without dlse.
GPU (marked gpu): every CUDA backend with a backward; half precision within 2x the error of a
plain same-dtype PyTorch implementation (FlashAttention's rule), fp32 < 1e-5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import waveboost
from reference import attention_backward_ref, attention_ref, random_qkv, rel_err

# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim)
SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 7, 7, 4, 2, 64),
    (1, 97, 97, 8, 1, 128),  # MQA
    (2, 257, 257, 2, 2, 80),
    (1, 97, 257, 8, 8, 32),  # seqlen_q < seqlen_k
    (2, 257, 97, 8, 4, 16),  # seqlen_q > seqlen_k: causal leaves rows with no key
    (1, 1, 257, 8, 1, 128),  # one query row
    (3, 7, 1, 2, 1, 3),  # odd head dim, one key
]
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def _ids(shape):
    return "B{}-Lq{}-Lk{}-H{}-Hkv{}-D{}".format(*shape)


def _inputs(rng, shape, dtype, causal, scale, with_dlse):
    """Random q, k, v, dout (and dlse), and the forward's out and lse from waveboost."""
    b, lq, lk, h, hkv, d = shape
    q, k, v = random_qkv(rng, b, lq, lk, h, hkv, d, dtype)
    dout = rng.standard_normal(q.shape).astype(dtype)
    dlse = rng.standard_normal((b, h, lq)).astype(np.float32) if with_dlse else None
    out, lse = waveboost.attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True, backend="cpu")
    return q, k, v, dout, dlse, out, lse


def _check_grads(grads, q, k, v, dout, causal, scale, dlse, tol):
    ref = attention_backward_ref(dout, q, k, v, causal=causal, softmax_scale=scale, dlse=dlse)
    for name, g, r, like in zip(("dq", "dk", "dv"), grads, ref, (q, k, v)):
        assert g.shape == like.shape and g.dtype == like.dtype, name
        assert np.isfinite(g).all(), f"{name}: unwritten (NaN-poisoned) or non-finite elements"
        err = rel_err(g, r)
        assert err < tol, f"{name}: relative error {err:.3g} >= {tol:.0e}"


@pytest.mark.parametrize("with_dlse", [False, True], ids=["no-dlse", "dlse"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_cpu_backward_matches_reference(rng, shape, causal, dtype, with_dlse):
    q, k, v, dout, dlse, out, lse = _inputs(rng, shape, dtype, causal, None, with_dlse)
    dq, dk, dv = (np.full_like(x, np.nan) for x in (q, k, v))  # poisoned: every element must be written
    res = waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, dlse=dlse, dq=dq, dk=dk, dv=dv,
                                       backend="cpu")
    assert res[0] is dq and res[1] is dk and res[2] is dv
    _check_grads(res, q, k, v, dout, causal, None, dlse, TOL[dtype])


@pytest.mark.parametrize("scale", [-0.7, 0.0, 2.5], ids=["negative", "zero", "large"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_backward_softmax_scale(rng, scale, causal):
    shape = (2, 33, 57, 4, 2, 64)
    q, k, v, dout, dlse, out, lse = _inputs(rng, shape, np.float64, causal, scale, True)
    grads = waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, softmax_scale=scale, dlse=dlse)
    _check_grads(grads, q, k, v, dout, causal, scale, dlse, 1e-12)
    # fp32 with a large scale: scores of size ~20 make the softmax sensitive to their rounding;
    # the bound is that of a plain fp32 implementation of the same formulas (x2).
    q32, k32, v32, do32 = (x.astype(np.float32) for x in (q, k, v, dout))
    out32, lse32 = waveboost.attention(q32, k32, v32, causal=causal, softmax_scale=scale, return_lse=True)
    grads32 = waveboost.attention_backward(do32, q32, k32, v32, out32, lse32, causal=causal, softmax_scale=scale,
                                           dlse=dlse)
    ref = attention_backward_ref(do32, q32, k32, v32, causal=causal, softmax_scale=scale, dlse=dlse)
    naive = attention_backward_ref(do32, q32, k32, v32, causal=causal, softmax_scale=scale, dlse=dlse,
                                   dtype=np.float32)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads32, ref, naive):
        assert rel_err(g, r) <= max(2 * rel_err(n, r), 1e-5), name


def test_cpu_backward_rows_that_see_no_key_get_zero_gradients(rng):
    # Lq > Lk, causal: query i sees keys j <= i + 4 - 9, so rows 0..4 see nothing.
    q, k, v, dout, dlse, out, lse = _inputs(rng, (2, 9, 4, 2, 1, 32), np.float32, True, None, True)
    dq, dk, dv = waveboost.attention_backward(dout, q, k, v, out, lse, causal=True, dlse=dlse)
    assert np.all(dq[:, :5] == 0) and np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    assert np.any(dq[:, 5:] != 0)
    _check_grads((dq, dk, dv), q, k, v, dout, True, None, dlse, 1e-5)


@pytest.mark.parametrize("lq, lk", [(0, 5), (5, 0)])
def test_cpu_backward_empty_sequences(rng, lq, lk):
    q, k, v = random_qkv(rng, 2, lq, lk, 4, 2, 16)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, lse = waveboost.attention(q, k, v, return_lse=True)
    dq, dk, dv = (np.full_like(x, np.nan) for x in (q, k, v))
    waveboost.attention_backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv)
    # No query (lq = 0): no key gets a gradient. No key (lk = 0): every row's output is 0.
    assert np.all(dq == 0) and np.all(dk == 0) and np.all(dv == 0)


def test_cpu_backward_strided_views(rng):
    # BHSD tensors passed as transposed views, outputs written into slices of larger buffers.
    b, lq, lk, h, hkv, d = 2, 37, 53, 4, 2, 24
    qt = rng.standard_normal((b, h, lq, d))
    kt = rng.standard_normal((b, hkv, lk, d))
    vt = rng.standard_normal((b, lk, 2 * hkv, d))[:, :, 1::2]  # every other head
    q, k, v = qt.transpose(0, 2, 1, 3), kt.transpose(0, 2, 1, 3), vt
    dout = rng.standard_normal((b, h, lq, 2 * d))[..., :d].transpose(0, 2, 1, 3)
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True)
    dq_buf = np.full((b, h, lq, d + 3), np.nan)
    dk_buf = np.full((b, lk, hkv, 2, d), np.nan)
    dv_buf = np.full((b, hkv, lk, d), np.nan)
    dq = dq_buf[..., 2 : d + 2].transpose(0, 2, 1, 3)
    dk = dk_buf[:, :, :, 1]
    dv = dv_buf.transpose(0, 2, 1, 3)
    waveboost.attention_backward(dout, q, k, v, out, lse, causal=True, dq=dq, dk=dk, dv=dv)
    _check_grads((dq, dk, dv), q, k, v, dout, True, None, None, 1e-12)
    assert np.isnan(dq_buf[..., :2]).all() and np.isnan(dk_buf[:, :, :, 0]).all(), "wrote outside the views"


def test_cpu_backward_is_deterministic(rng):
    q, k, v, dout, dlse, out, lse = _inputs(rng, (2, 200, 300, 8, 2, 64), np.float32, True, None, True)
    first = waveboost.attention_backward(dout, q, k, v, out, lse, causal=True, dlse=dlse)
    for deterministic in (False, True):
        again = waveboost.attention_backward(dout, q, k, v, out, lse, causal=True, dlse=dlse,
                                             deterministic=deterministic)
        for a, b in zip(first, again):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 200, 300, 8, 2, 64), (1, 257, 97, 4, 4, 16), (3, 7, 1, 2, 1, 3),
                                   (1, 130, 130, 4, 1, 128)], ids=_ids)
def test_cpu_backward_schedules_agree_bitwise(rng, monkeypatch, shape, causal, dtype):
    """The one-pass schedule (a task per kv head) and the two phases give the same bits, so the
    choice between them, which depends on the thread count, never shows in the gradients."""
    q, k, v, dout, dlse, out, lse = _inputs(rng, shape, dtype, causal, None, True)
    grads = {}
    for schedule in ("two-phase", "one-pass"):
        monkeypatch.setenv("WAVEBOOST_CPU_BACKWARD", schedule)
        grads[schedule] = waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, dlse=dlse,
                                                       backend="cpu")
    for a, b in zip(grads["two-phase"], grads["one-pass"]):
        assert np.array_equal(a, b)
    _check_grads(grads["one-pass"], q, k, v, dout, causal, None, dlse, TOL[dtype])


def test_cpu_backward_dlse_adds_its_term(rng):
    # dlse alone (dout = 0): the gradient is that of sum(dlse * lse), whose d/dS is dlse * P.
    q, k, v, _, dlse, out, lse = _inputs(rng, (1, 19, 23, 2, 1, 8), np.float64, False, None, True)
    dout = np.zeros_like(q)
    dq, dk, dv = waveboost.attention_backward(dout, q, k, v, out, lse, dlse=dlse)
    assert np.all(dv == 0) and np.any(dq != 0)
    _check_grads((dq, dk, dv), q, k, v, dout, False, None, dlse, 1e-12)


def test_backward_matches_finite_differences(rng):
    # An independent check of the reference's formulas (and the kernel): central differences of
    # L = sum(dout * out) + sum(dlse * lse) in float64.
    b, lq, lk, h, hkv, d = 1, 5, 6, 2, 1, 4
    q, k, v = random_qkv(rng, b, lq, lk, h, hkv, d, np.float64)
    dout = rng.standard_normal(q.shape)
    dlse = rng.standard_normal((b, h, lq))

    def loss(q_, k_, v_):
        o, l = attention_ref(q_, k_, v_, causal=True)
        return float(np.sum(dout * o) + np.sum(dlse * l))

    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True)
    grads = waveboost.attention_backward(dout, q, k, v, out, lse, causal=True, dlse=dlse.astype(np.float32))
    eps = 1e-6
    for which, g in enumerate(grads):
        args = [q, k, v]
        numeric = np.zeros_like(args[which])
        for idx in np.ndindex(*args[which].shape):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            numeric[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        # dlse went through float32: its rounding (~1e-8 relative) bounds the agreement.
        np.testing.assert_allclose(g, numeric, rtol=1e-6, atol=1e-7)


def test_backward_on_torch_tensors_returns_torch(rng):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.tensor(x) for x in random_qkv(rng, 1, 17, 17, 4, 2, 32))
    q.requires_grad_(True)
    out, lse = waveboost.attention(q, k, v, return_lse=True)
    dout = torch.randn_like(q)
    dq, dk, dv = waveboost.attention_backward(dout, q, k, v, out, lse)
    assert all(isinstance(x, torch.Tensor) for x in (dq, dk, dv))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.dtype == v.dtype
    ref = attention_backward_ref(dout.numpy(), q.detach().numpy(), k.numpy(), v.numpy())
    for g, r in zip((dq, dk, dv), ref):
        assert rel_err(g.numpy(), r) < 1e-5


def test_backward_on_jax_arrays_returns_jax(rng):
    jnp = pytest.importorskip("jax.numpy")
    arrays = random_qkv(rng, 1, 17, 9, 4, 2, 32)
    q, k, v = (jnp.asarray(x) for x in arrays)
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True)
    dout = jnp.asarray(rng.standard_normal(q.shape).astype(np.float32))
    grads = waveboost.attention_backward(dout, q, k, v, out, lse, causal=True)
    ref = attention_backward_ref(np.asarray(dout), *arrays, causal=True)
    for g, r in zip(grads, ref):
        assert type(g).__module__.split(".")[0] in ("jax", "jaxlib")
        assert rel_err(np.asarray(g), r) < 1e-5


def test_resolve_backend_for_the_backward(rng):
    q, k, v = random_qkv(rng, 1, 5, 5, 2, 2, 16)
    assert waveboost.resolve_backend(q, k, v, backward=True) == "cpu"
    assert waveboost.resolve_backend(q, k, v, backward=True, deterministic=True) == "cpu"
    with pytest.raises(ValueError, match="backward=True"):
        waveboost.resolve_backend(q, k, v, deterministic=True)
    with pytest.raises(TypeError, match="deterministic"):
        waveboost.resolve_backend(q, k, v, backward=True, deterministic="yes")
    assert set(waveboost.backward_backends()) >= {"auto", "cpu"}
    assert "simt" not in waveboost.backward_backends() and "wmma" not in waveboost.backward_backends()


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@pytest.fixture
def case(rng):
    q, k, v, dout, dlse, out, lse = _inputs(rng, (2, 7, 9, 4, 2, 16), np.float32, False, None, True)
    return dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse, dlse=dlse)


def _call(case, **changes):
    args = dict(case, **changes)
    return waveboost.attention_backward(args.pop("dout"), args.pop("q"), args.pop("k"), args.pop("v"),
                                        args.pop("out"), args.pop("lse"), **args)


@pytest.mark.parametrize("backend", ["simt", "wmma"])
def test_forward_only_backends_are_refused(case, backend):
    with pytest.raises(ValueError, match=rf"'{backend}' is forward-only.*'cpu'"):
        _call(case, backend=backend)


def test_unknown_backend(case):
    with pytest.raises(ValueError, match="backend must be one of"):
        _call(case, backend="fast")


@pytest.mark.parametrize(
    "name, make, pattern",
    [
        ("dout", lambda c: c["dout"][:, :6], r"dout has shape \(2, 6, 4, 16\) but q has shape \(2, 7, 4, 16\)"),
        ("out", lambda c: c["out"][:, :, :2], r"out has heads 2 .* q's heads is 4"),
        ("lse", lambda c: c["lse"][:, :, :5], r"lse has seqlen_q 5 .* q's seqlen_q is 7"),
        ("lse", lambda c: c["lse"][0], r"lse must be a 3-D tensor"),
        ("dlse", lambda c: c["dlse"][:, :3], r"dlse has shape \(2, 3, 7\) but lse has shape \(2, 4, 7\)"),
        ("dq", lambda c: np.empty_like(c["k"]), r"dq has shape \(2, 9, 2, 16\) but q has shape \(2, 7, 4, 16\)"),
        ("dk", lambda c: np.empty_like(c["q"]), r"dk has shape \(2, 7, 4, 16\) but k has shape \(2, 9, 2, 16\)"),
        ("dv", lambda c: np.empty((2, 9, 2, 8), np.float32), r"dv has shape .* but v has shape"),
    ],
)
def test_mismatched_shapes(case, name, make, pattern):
    with pytest.raises(ValueError, match=pattern):
        _call(case, **{name: make(case)})


@pytest.mark.parametrize(
    "name, make, pattern",
    [
        ("lse", lambda c: c["lse"].astype(np.float64), "lse must have dtype float32; got float64"),
        ("dlse", lambda c: c["dlse"].astype(np.float64), "dlse must have dtype float32; got float64"),
        ("dout", lambda c: c["dout"].astype(np.float64), "dout has dtype float64 but q has float32"),
        ("dq", lambda c: np.empty(c["q"].shape, np.float64), "dq has dtype float64 but q has float32"),
    ],
)
def test_wrong_dtypes(case, name, make, pattern):
    with pytest.raises(TypeError, match=pattern):
        _call(case, **{name: make(case)})


def test_half_precision_on_cpu_says_what_is_supported(case):
    half = {n: case[n].astype(np.float16) for n in ("dout", "q", "k", "v", "out")}
    with pytest.raises(ValueError, match="float32 and float64; got float16"):
        _call(case, **half)


def test_gradients_must_not_alias(case):
    with pytest.raises(ValueError, match="dq overlaps the memory of q"):
        _call(case, dq=case["q"])
    dk = np.empty_like(case["k"])
    with pytest.raises(ValueError, match="dv overlaps the memory of dk"):
        _call(case, dk=dk, dv=dk)
    with pytest.raises(ValueError, match="dk has overlapping elements"):
        row = np.empty(16, np.float32)
        _call(case, dk=np.lib.stride_tricks.as_strided(row, case["k"].shape, (0, 0, 0, 4), writeable=True))


def test_missing_tensors_and_mixed_frameworks(case):
    with pytest.raises(TypeError, match="lse is required"):
        _call(case, lse=None)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="dout is a torch array but q is a numpy array"):
        _call(case, dout=torch.tensor(case["dout"]))


# ---------------------------------------------------------------------------
# CUDA backends
# ---------------------------------------------------------------------------

GPU_BACKENDS = [b for b in waveboost.backward_backends() if b not in ("auto", "cpu")]
GPU_DTYPES = ["fp16", "bf16", "fp32"]
GPU_SHAPES = [
    (1, 1, 1, 8, 8, 64),
    (2, 7, 7, 8, 4, 64),
    (1, 97, 97, 8, 1, 128),
    (2, 257, 257, 8, 2, 64),
    (1, 97, 257, 8, 8, 128),
    (2, 257, 97, 8, 2, 128),
    (1, 1025, 1025, 4, 1, 64),
]


def _check_fp32_grad(name, g, r, all_refs):
    """fp32: relative error < 1e-5; where the exact gradient (nearly) vanishes, e.g. dq with one key
    (dP - D = 0), the relative error is meaningless and the bound is 1e-5 of the largest element of
    any of the three gradients instead."""
    rel = ((g.double() - r).norm() / r.norm().clamp_min(1e-300)).item()
    err = (g.double() - r).abs().max().item() if r.numel() else 0.0
    floor = 1e-5 * max(x.abs().max().item() if x.numel() else 0.0 for x in all_refs)
    assert rel < 1e-5 or err <= floor, f"{name}: relative error {rel:.3g}, max error {err:.3g} > {floor:.3g}"


def _torch_grads(dout, q, k, v, causal, scale, dlse, dtype):
    """Gradients of a plain attention in `dtype` (torch autograd), on q's device."""
    import torch

    from reference import attention_ref_torch

    leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    out, lse = attention_ref_torch(*leaves, causal, scale, dtype=dtype)
    loss = (out * dout.to(dtype)).sum()
    if dlse is not None:
        loss = loss + (torch.where(torch.isinf(lse), 0, lse) * dlse.double()).sum()
    return torch.autograd.grad(loss, leaves)


@pytest.mark.gpu
@pytest.mark.parametrize("with_dlse", [False, True], ids=["no-dlse", "dlse"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=_ids)
@pytest.mark.parametrize("dname", GPU_DTYPES)
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_backward(backend, dname, shape, causal, with_dlse):
    import torch

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dname]
    b, lq, lk, h, hkv, d = shape
    gen = torch.Generator(device="cuda").manual_seed(hash((backend, dname, shape, causal)) % 2**31)
    mk = lambda *s: torch.randn(*s, generator=gen, device="cuda").to(dtype)  # noqa: E731
    q, k, v, dout = mk(b, lq, h, d), mk(b, lk, hkv, d), mk(b, lk, hkv, d), mk(b, lq, h, d)
    dlse = torch.randn(b, h, lq, generator=gen, device="cuda") if with_dlse else None
    try:
        waveboost.resolve_backend(q, k, v, causal=causal, backend=backend, backward=True)
    except ValueError as e:
        pytest.skip(f"backend {backend!r} cannot run this case: {e}")
    out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, dlse=dlse, dq=dq, dk=dk, dv=dv,
                                 backend=backend)
    torch.cuda.synchronize()
    scale = 1 / math.sqrt(d)
    ref = _torch_grads(dout, q, k, v, causal, scale, dlse, torch.float64)
    for name, g, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert torch.isfinite(g).all(), f"{name}: unwritten (NaN-poisoned) or non-finite elements"
        if dname == "fp32":
            _check_fp32_grad(name, g, r, ref)
    if dname != "fp32":
        naive = _torch_grads(dout, q, k, v, causal, scale, dlse, dtype)
        for name, g, r, n in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, naive):
            err = (g.double() - r).abs().max().item()
            naive_err = (n.double() - r).abs().max().item()
            assert err <= 2 * naive_err + 1e-3 * r.abs().max().item() + 1e-5, (
                f"{name}: max error {err:.3g} against 2x {naive_err:.3g} of a same-dtype implementation")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_backward_deterministic_is_bitwise_reproducible(backend):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(2, 1000, 8, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 1000, 2, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    try:
        waveboost.resolve_backend(q, k, v, causal=True, backend=backend, backward=True)
    except ValueError as e:
        pytest.skip(f"backend {backend!r} cannot run this case: {e}")
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True)
    (capability,) = [r for r in waveboost.capabilities() if r["backend"] == backend]
    if not capability["deterministic_backward"]:  # e.g. wgmma: its dQ sums by atomics
        with pytest.raises(ValueError, match="deterministic"):
            waveboost.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True, backend=backend)
        return
    runs = [waveboost.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True, backend=backend)
            for _ in range(3)]
    for again in runs[1:]:
        for a, b in zip(runs[0], again):
            assert torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_backward_on_a_forward_only_backend_names_those_with_one():
    import torch

    q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.float16)
    out, lse = waveboost.attention(q, q, q, return_lse=True)
    for backend in ("simt", "wmma"):
        with pytest.raises(ValueError, match="forward-only.*'naive'"):
            waveboost.attention_backward(q, q, q, q, out, lse, backend=backend)


# ---------------------------------------------------------------------------
# PyTorch: autograd through waveboost.torch.attention and waveboost.attention
# ---------------------------------------------------------------------------


def _torch_leaves(rng, shape, dtype_name="float64"):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    b, lq, lk, h, hkv, d = shape
    q, k, v = random_qkv(rng, b, lq, lk, h, hkv, d, np.float64)
    return [torch.tensor(x, dtype=dtype).requires_grad_(True) for x in (q, k, v)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 9, 11, 4, 2, 8), (1, 7, 3, 2, 1, 5), (1, 1, 6, 3, 3, 4)], ids=_ids)
def test_torch_gradcheck_float64(rng, shape, causal):
    # Through the custom op (waveboost.torch.attention) and the generic API on tensors that
    # require grad (which must take the same differentiable route).
    torch = pytest.importorskip("torch")

    import waveboost.torch as wbt

    leaves = _torch_leaves(rng, shape)
    assert torch.autograd.gradcheck(lambda q, k, v: wbt.attention(q, k, v, causal=causal), leaves)
    assert torch.autograd.gradcheck(
        lambda q, k, v: waveboost.attention(q, k, v, causal=causal, softmax_scale=-0.6), leaves)


def test_torch_gradient_into_lse_is_honoured(rng):
    torch = pytest.importorskip("torch")

    import waveboost.torch as wbt

    leaves = _torch_leaves(rng, (2, 13, 17, 4, 2, 16))
    out, lse = wbt.attention(*leaves, causal=True, return_lse=True)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    got = torch.autograd.grad((out * dout).sum() + (lse * dlse).sum(), leaves, retain_graph=True)
    ref = attention_backward_ref(dout.numpy(), *(x.detach().numpy() for x in leaves), causal=True,
                                 dlse=dlse.numpy())
    for g, r in zip(got, ref):
        assert rel_err(g.numpy(), r) < 1e-12
    # lse alone: dout is zero, and dV must be exactly zero.
    got = torch.autograd.grad((lse * dlse).sum(), leaves)
    assert torch.all(got[2] == 0) and torch.any(got[0] != 0)


def test_torch_generic_api_does_not_detach(rng):
    torch = pytest.importorskip("torch")

    q, k, v = _torch_leaves(rng, (1, 5, 5, 2, 1, 8))
    out = waveboost.attention(q, k, v)
    assert out.requires_grad and out.grad_fn is not None
    with torch.no_grad():
        assert not waveboost.attention(q, k, v).requires_grad
    with pytest.raises(ValueError, match="out= cannot be used when q, k or v requires grad"):
        waveboost.attention(q, k, v, out=torch.empty_like(q.detach()))
    with torch.no_grad():  # out= is fine where no graph is recorded
        waveboost.attention(q, k, v, out=torch.empty_like(q.detach()))


def test_torch_opcheck_with_autograd(rng):
    torch = pytest.importorskip("torch")
    import waveboost.torch as wbt  # registers torch.ops.waveboost, whichever tests ran before in this process

    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    q, k, v = _torch_leaves(rng, (2, 9, 12, 4, 2, 16))
    for causal, scale in ((True, None), (False, 0.3)):
        result = torch.library.opcheck(torch.ops.waveboost.attention.default, (q, k, v, causal, scale, "auto"),
                                       test_utils=utils)
        assert result == dict.fromkeys(utils, "SUCCESS")

    out, lse = wbt.attention(q, k, v, return_lse=True)
    args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
            torch.randn_like(lse), False, None, False, "auto")
    result = torch.library.opcheck(torch.ops.waveboost.attention_backward.default, args, test_utils=utils)
    assert result == dict.fromkeys(utils, "SUCCESS")


def test_torch_compile_traces_forward_and_backward(rng):
    torch = pytest.importorskip("torch")
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    import waveboost.torch as wbt

    graphs = {"forward": [], "backward": []}

    def recorder(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm.code)
            return make_boxed_func(gm.forward)
        return compiler

    backend = aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"))

    def step(q, k, v):
        out, lse = wbt.attention(q, k, v, causal=True, return_lse=True)
        return (out * out).sum() + lse.sum()

    leaves = _torch_leaves(rng, (2, 11, 13, 4, 2, 8))
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    grads = torch.autograd.grad(compiled(*leaves), leaves)
    assert any("waveboost.attention.default" in g for g in graphs["forward"])
    assert any("waveboost.attention_backward.default" in g for g in graphs["backward"])
    expected = torch.autograd.grad(step(*leaves), leaves)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_torch_multihead_attention_trains_like_sdpa(dtype_name):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    import waveboost.torch as wbt

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    embed, heads, kv_heads, batch, seqlen = 32, 4, 2, 3, 19
    model = wbt.MultiheadAttention(embed, heads, kv_heads, causal=True, dtype=dtype)
    twin = wbt.MultiheadAttention(embed, heads, kv_heads, causal=True, dtype=dtype)
    twin.load_state_dict(model.state_dict())

    def sdpa_forward(m, x):  # the same module with PyTorch's attention
        b, l, _ = x.shape
        q = m.q_proj(x).view(b, l, m.num_heads, m.head_dim).transpose(1, 2)
        k = m.k_proj(x).view(b, l, m.num_kv_heads, m.head_dim).transpose(1, 2)
        v = m.v_proj(x).view(b, l, m.num_kv_heads, m.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return m.out_proj(out.transpose(1, 2).reshape(b, l, m.embed_dim))

    x = torch.randn(batch, seqlen, embed, dtype=dtype)
    target = torch.randn(batch, seqlen, embed, dtype=dtype)
    losses = {"waveboost": [], "sdpa": []}
    for name, m, fwd in (("waveboost", model, lambda m, x: m(x)), ("sdpa", twin, sdpa_forward)):
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        for _ in range(15):
            opt.zero_grad()
            loss = F.mse_loss(fwd(m, x), target)
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    ours, theirs = np.array(losses["waveboost"]), np.array(losses["sdpa"])
    assert ours[-1] < 0.8 * ours[0], "the loss must go down"
    tol = 1e-4 if dtype_name == "float32" else 1e-10
    np.testing.assert_allclose(ours, theirs, rtol=tol)


# ---------------------------------------------------------------------------
# JAX: jax.custom_vjp over the XLA FFI backward
# ---------------------------------------------------------------------------


def _jax_or_skip():
    jax = pytest.importorskip("jax")
    import waveboost.jax as wj

    if not wj.ffi_available():
        pytest.skip("this build of waveboost has no XLA FFI handlers (jaxlib's headers were not found at build time)")
    return jax, wj


def _on_cpu(jax):
    """The CPU path's tests place their arrays on the host even where JAX's default device is a GPU."""
    return jax.default_device(jax.devices("cpu")[0])


def _jax_qkv(rng, shape, dtype=np.float64):
    import jax.numpy as jnp

    b, lq, lk, h, hkv, d = shape
    return tuple(jnp.asarray(x) for x in random_qkv(rng, b, lq, lk, h, hkv, d, dtype))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 9, 11, 4, 2, 8), (1, 7, 3, 2, 1, 5)], ids=_ids)
def test_jax_check_grads_float64(rng, shape, causal):
    jax, wj = _jax_or_skip()
    from jax.test_util import check_grads

    with jax.enable_x64(True), _on_cpu(jax):
        q, k, v = _jax_qkv(rng, shape)
        check_grads(lambda q, k, v: wj.attention(q, k, v, causal=causal), (q, k, v), order=1, modes=["rev"])
        check_grads(jax.jit(lambda q, k, v: wj.attention(q, k, v, causal=causal, softmax_scale=-0.4)), (q, k, v),
                    order=1, modes=["rev"])


def test_jax_grad_under_jit_vmap_and_checkpoint_matches_reference(rng):
    jax, wj = _jax_or_skip()
    import jax.numpy as jnp

    with jax.enable_x64(True), _on_cpu(jax):
        q, k, v = _jax_qkv(rng, (2, 13, 17, 4, 2, 16))
        w = jnp.asarray(rng.standard_normal(q.shape))

        def loss(q, k, v):
            out, lse = wj.attention(q, k, v, causal=True, return_lse=True)
            return jnp.sum(out * w) + jnp.sum(jnp.sin(lse))  # a cotangent into lse too

        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
        _, lse = wj.attention(q, k, v, causal=True, return_lse=True)
        dlse = np.cos(np.asarray(lse, np.float64)).astype(np.float32)
        ref = attention_backward_ref(np.asarray(w), np.asarray(q), np.asarray(k), np.asarray(v), causal=True,
                                     dlse=dlse)
        for g, r in zip(grads, ref):
            # lse is float32 whatever the inputs: its cotangent carries float32 rounding.
            assert rel_err(np.asarray(g), r) < 1e-6
        remat = jax.grad(jax.checkpoint(loss), argnums=(0, 1, 2))(q, k, v)
        for a, b in zip(remat, grads):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        # vmap over a leading axis of q (k, v shared): each slice's gradient as computed alone.
        qs = jnp.stack([q, 0.5 * q, -q])
        batched = jax.vmap(jax.grad(loss), in_axes=(0, None, None))(qs, k, v)
        for i in range(3):
            alone = jax.grad(loss)(qs[i], k, v)
            np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(alone), rtol=1e-12, atol=1e-12)


def test_jax_forward_only_backend_trains_on_auto_and_explicit_backward_refuses(rng):
    jax, wj = _jax_or_skip()
    import jax.numpy as jnp

    with _on_cpu(jax):
        q, k, v = _jax_qkv(rng, (1, 5, 5, 2, 1, 8), np.float32)
        out, lse = wj.attention(q, k, v, return_lse=True)
        with pytest.raises(ValueError, match="'simt' is forward-only.*'cpu'"):
            wj.attention_backward(out, q, k, v, out, lse, backend="simt")
        with pytest.raises(TypeError, match="lse must have dtype float32"):
            wj.attention_backward(out, q, k, v, out, lse.astype(jnp.float16))
        with pytest.raises(ValueError, match=r"dout has shape \(1, 4, 2, 8\) but q has shape \(1, 5, 2, 8\)"):
            wj.attention_backward(out[:, :4], q, k, v, out, lse)
        g = jax.grad(lambda q: jnp.sum(wj.attention(q, k, v, backend="cpu") ** 2))(q)
        ref = attention_backward_ref(2 * np.asarray(out), np.asarray(q), np.asarray(k), np.asarray(v))[0]
        assert rel_err(np.asarray(g), ref) < 1e-5


# ---------------------------------------------------------------------------
# Frameworks on CUDA: autograd, torch.compile, CUDA graphs, JAX
# ---------------------------------------------------------------------------


def _cuda_qkv(shape, dtype, seed):
    import torch

    b, lq, lk, h, hkv, d = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=gen, device="cuda").to(dtype)  # noqa: E731
    return mk(b, lq, h, d), mk(b, lk, hkv, d), mk(b, lk, hkv, d)


@pytest.mark.gpu
@pytest.mark.parametrize("dname", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("shape", [(2, 257, 97, 8, 2, 64), (1, 97, 257, 8, 8, 128), (2, 7, 7, 4, 1, 40)], ids=_ids)
def test_gpu_torch_autograd_matches_reference(dname, shape):
    import torch

    import waveboost.torch as wbt

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dname]
    q, k, v = (x.requires_grad_(True) for x in _cuda_qkv(shape, dtype, 11))
    try:
        waveboost.resolve_backend(q, k, v, causal=True, backward=True)
    except ValueError as e:
        pytest.skip(f"no CUDA backward for this case: {e}")
    out, lse = wbt.attention(q, k, v, causal=True, return_lse=True)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out, lse), (q, k, v), (dout, dlse))
    scale = 1 / math.sqrt(shape[-1])
    ref = _torch_grads(dout, q, k, v, True, scale, dlse, torch.float64)
    naive = _torch_grads(dout, q, k, v, True, scale, dlse, dtype)
    for name, g, r, n in zip(("dq", "dk", "dv"), got, ref, naive):
        assert g.dtype == dtype and torch.isfinite(g).all(), name
        err = (g.double() - r).abs().max().item()
        if dname == "fp32":
            _check_fp32_grad(name, g, r, ref)
        else:
            naive_err = (n.double() - r).abs().max().item()
            assert err <= 2 * naive_err + 1e-3 * r.abs().max().item() + 1e-5, (name, err, naive_err)


@pytest.mark.gpu
def test_gpu_torch_compile_and_cuda_graph_training_step():
    import torch

    import waveboost.torch as wbt

    torch.manual_seed(0)
    model = wbt.MultiheadAttention(256, 4, 2, causal=True, device="cuda", dtype=torch.bfloat16)
    x0 = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16)
    q = torch.empty(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16)  # the module's (B, L, H, D) views
    try:
        waveboost.resolve_backend(q, q[:, :, :2], q[:, :, :2], causal=True, backward=True)
    except ValueError as e:
        pytest.skip(f"no CUDA backward for this case: {e}")

    def eager_grads(x):
        model.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    expected = eager_grads(x0)
    # torch.compile: forward and backward in one graph each, no graph break.
    compiled = torch.compile(model, fullgraph=True)
    model.zero_grad(set_to_none=True)
    compiled(x0).float().square().mean().backward()
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e, rtol=2e-2, atol=2e-2)
    # A whole step (forward, backward) captured in a CUDA graph and replayed on new data.
    static_x = x0.clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up outside the capture
            for p in model.parameters():
                p.grad.zero_()
            model(static_x).float().square().mean().backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for p in model.parameters():
            p.grad.zero_()
        model(static_x).float().square().mean().backward()
    x1 = torch.randn_like(x0)
    static_x.copy_(x1)
    graph.replay()
    torch.cuda.synchronize()
    replayed = [p.grad.clone() for p in model.parameters()]
    # dQ may be accumulated with atomics (a different summation order per run): bf16 tolerances.
    for r, e in zip(replayed, eager_grads(x1)):
        torch.testing.assert_close(r, e)


@pytest.mark.gpu
def test_gpu_jax_grad_under_jit_matches_reference():
    jax, wj = _jax_or_skip()
    import jax.numpy as jnp

    gpus = [d for d in jax.devices() if d.platform == "gpu"] if jax.default_backend() == "gpu" else []
    if not gpus:
        pytest.skip("JAX sees no GPU")
    rng = np.random.default_rng(3)
    b, lq, lk, h, hkv, d = 2, 97, 257, 8, 2, 64
    arrays = random_qkv(rng, b, lq, lk, h, hkv, d, np.float32)
    w = rng.standard_normal((b, lq, h, d)).astype(np.float32)
    # bf16: P, dS and the gradients are rounded to bf16 (unit roundoff 2^-8) on the way.
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)):
        q, k, v = (jax.device_put(jnp.asarray(x, dtype), gpus[0]) for x in arrays)

        def loss(q, k, v):
            return jnp.sum(wj.attention(q, k, v, causal=True).astype(jnp.float32) * w)

        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
        qf, kf, vf = (np.asarray(x.astype(jnp.float32), np.float64) for x in (q, k, v))
        ref = attention_backward_ref(w, qf, kf, vf, causal=True)
        for g, r in zip(grads, ref):
            g = np.asarray(g.astype(jnp.float32))
            assert np.isfinite(g).all()
            assert rel_err(g, r) < tol


def test_jax_preallocated_gradients_need_concrete_arrays(rng):
    jax, wj = _jax_or_skip()
    import jax.numpy as jnp

    q, k, v = _jax_qkv(rng, (1, 5, 6, 2, 1, 8), np.float32)
    out, lse = wj.attention(q, k, v, return_lse=True)
    # Eagerly, dq/dk/dv are written through DLPack.
    dq, dk, dv = jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)
    res = waveboost.attention_backward(out, q, k, v, out, lse, dq=dq, dk=dk, dv=dv)
    ref = attention_backward_ref(np.asarray(out), np.asarray(q), np.asarray(k), np.asarray(v))
    for g, r in zip(res, ref):
        assert rel_err(np.asarray(g), r) < 1e-5
    with pytest.raises(TypeError, match="dq=, dk= and dv= need concrete JAX arrays"):
        jax.jit(lambda q: waveboost.attention_backward(out, q, k, v, out, lse, dq=dq)[0])(q)


def test_cpu_backward_random_shapes_property():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
    @hypothesis.given(b=st.integers(1, 2), lq=st.integers(1, 70), lk=st.integers(1, 70), hkv=st.integers(1, 3),
                      group=st.sampled_from([1, 2, 4]), d=st.integers(1, 20), causal=st.booleans(),
                      scale=st.one_of(st.none(), st.floats(-3, 3)), with_dlse=st.booleans(), seed=st.integers(0, 99))
    def check(b, lq, lk, hkv, group, d, causal, scale, with_dlse, seed):
        rng = np.random.default_rng(seed)
        shape = (b, lq, lk, hkv * group, hkv, d)
        q, k, v, dout, dlse, out, lse = _inputs(rng, shape, np.float64, causal, scale, with_dlse)
        grads = waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, softmax_scale=scale, dlse=dlse)
        _check_grads(grads, q, k, v, dout, causal, scale, dlse, 1e-11)

    check()


def test_torch_deterministic_algorithms_reach_the_backward(rng, monkeypatch):
    torch = pytest.importorskip("torch")
    import waveboost._api as api
    import waveboost.torch as wbt

    seen = []
    real = api.attention_backward

    def spy(*args, **kwargs):
        seen.append(kwargs["deterministic"])
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "attention_backward", spy)
    q, k, v = _torch_leaves(rng, (1, 6, 6, 2, 1, 8))
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        for flag in (False, True):
            torch.use_deterministic_algorithms(flag)
            wbt.attention(q, k, v).sum().backward()
    finally:
        torch.use_deterministic_algorithms(previous)
    assert seen == [False, True]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
def test_cpu_backward_uses_the_given_lse_over_more_keys(rng, dtype):
    # Ring attention's contract: the backward of one KV shard, given the merged out and lse of all
    # shards, is that shard's part of the whole call's gradient (P = exp(S - lse_global)).
    q, k, v = random_qkv(rng, 2, 23, 40, 4, 2, 16, dtype)
    dout = rng.standard_normal(q.shape).astype(dtype)
    dlse = rng.standard_normal((2, 4, 23)).astype(np.float32)
    out, lse = waveboost.attention(q, k, v, return_lse=True)
    dq, dk, dv = attention_backward_ref(dout, q, k, v, dlse=dlse)
    parts = [waveboost.attention_backward(dout, q, k[:, keys], v[:, keys], out, lse, dlse=dlse)
             for keys in (slice(0, 17), slice(17, 40))]
    # The float32 lse sets the accuracy: P's relative error is lse's absolute rounding error.
    tol = 1e-5 if dtype == np.float32 else 1e-6
    assert rel_err(parts[0][0] + parts[1][0], dq) < tol
    assert rel_err(np.concatenate([parts[0][1], parts[1][1]], axis=1), dk) < tol
    assert rel_err(np.concatenate([parts[0][2], parts[1][2]], axis=1), dv) < tol
