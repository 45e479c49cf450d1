"""Numerics at the edges: large scores, fp16 near its top, NaN/Inf, fully masked rows, reproducibility.

Error rule for the edge cases (where a same-dtype naive softmax would itself overflow): every
element within tests/reference.py:rounding_error_bound, the first-order forward error bound of a
correct kernel (scores summed in fp32 -- fp64 on the CPU's fp64 path -- propagated through the
softmax, plus rounding P and O to the storage type). It is tight where the softmax is one-hot and
loose only at near-ties; an overflowed, flushed or misread result lands far outside it.

NaN/Inf follow tests/reference.py:attention_ref_ieee: a row with a NaN (or +inf) visible score
outputs NaN and LSE NaN (+inf accepted); a row whose visible scores are all -inf outputs zeros and
LSE -inf, like a row that sees no key; scores of keys a row does not see never matter; NaN/Inf in a
v row reaches only that column of the rows that see it (rows that do not see it: unspecified there).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import waveboost
from reference import attention_ref, attention_ref_ieee, random_qkv, rounding_error_bound

# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------

DEV = "cuda"
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24, "fp64": 2.0**-53}
GPU_PATH_DTYPES = [("naive", "fp16"), ("naive", "bf16"), ("naive", "fp32"), ("simt", "fp16"), ("simt", "bf16"),
                   ("simt", "fp32"), ("wmma", "fp16"), ("wmma", "bf16"), ("mma", "fp16"), ("mma", "bf16"),
                   ("mma", "fp32"), ("wgmma", "fp16"), ("wgmma", "bf16")]
GPU_IDS = [f"{p}-{d}" for p, d in GPU_PATH_DTYPES]
# Absolute tolerance on unit-normal data for elements that touch no non-finite input.
FINITE_ATOL = {"fp16": 5e-3, "bf16": 3e-2, "fp32": 1e-4, "fp64": 1e-10}


def _check_nonfinite(out, lse, ref, ref_lse, atol, unspecified=None):
    """out/ref (B, Lq, H, D), lse/ref_lse (B, H, Lq); `unspecified` masks out elements not checked."""
    out = np.asarray(out, np.float64)
    lse = np.asarray(lse, np.float64)
    checked = np.ones(ref.shape, bool) if unspecified is None else ~unspecified
    bad_ref = ~np.isfinite(ref) & checked
    assert np.all(~np.isfinite(out[bad_ref])), "an element the reference makes NaN/Inf came out finite"
    good = np.isfinite(ref) & checked
    assert np.all(np.isfinite(out[good])), "an element that touches no NaN/Inf came out non-finite"
    if good.any():
        assert np.max(np.abs(out[good] - ref[good])) <= atol
    neg = np.isneginf(ref_lse)
    assert np.all(np.isneginf(lse[neg])), "rows that see no key (or only -inf scores) need LSE -inf"
    nan_like = np.isnan(ref_lse) | np.isposinf(ref_lse)
    assert np.all(np.isnan(lse[nan_like]) | np.isposinf(lse[nan_like])), "a NaN row's LSE must be NaN (or +inf)"
    fin = np.isfinite(ref_lse)
    assert np.all(np.isfinite(lse[fin]))
    if fin.any():
        assert np.max(np.abs(lse[fin] - ref_lse[fin])) <= max(atol, 1e-3)


# Non-finite cases: (B=2, Lq=37, Lk=53, H=4, Hkv=2). Under causal, query i sees keys j <= i + 16.
NF_SHAPE = (2, 37, 53, 4, 2)
# Keys over 6 tiles of 128 on a grid of 8 blocks: the wgmma path splits the keys (split-KV).
NF_SPLIT_SHAPE = (2, 37, 653, 4, 2)
NF_CASES = ["nan_q", "nan_k", "nan_v", "inf_v", "neg_inf_row", "pos_inf_row"]


def _poison(case, q, k, v, causal):
    """Writes the non-finite values of `case` into q, k, v (float arrays) in place.

    Returns the mask of output elements the contract leaves unspecified (None if all are specified).
    """
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    group = h // hkv
    unspecified = None
    if case == "nan_q":
        q[1, 5, 3, 2] = np.nan
    # Key lk - 13 (40 in NF_SHAPE); causal: rows >= lq - 13 see it (24 in NF_SHAPE).
    key, first_row = lk - 13, lq - 13
    if case == "nan_k":
        k[1, key, 1, 3] = np.nan  # query heads 2, 3 of batch 1
    elif case in ("nan_v", "inf_v"):
        v[1, key, 1, 7] = np.nan if case == "nan_v" else np.inf
        # Rows that do not see the key may get NaN in column 7 (0 * NaN in P V).
        unspecified = np.zeros((b, lq, h, d), bool)
        if causal:
            unspecified[1, :first_row, group * 1 : group * 2, 7] = True
    elif case in ("neg_inf_row", "pos_inf_row"):
        # q row [+-inf, 0, ...] against keys whose first element is positive: every score is +-inf.
        k[1, :, 0, 0] = np.abs(k[1, :, 0, 0]) + 0.25
        q[1, 9, 0, :] = 0
        q[1, 9, 0, 0] = -np.inf if case == "neg_inf_row" else np.inf
    return unspecified


# ---------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
def test_cpu_scores_up_to_1e4(rng, dtype, causal):
    q, k, v = random_qkv(rng, 2, 150, 211, 4, 2, 64, dtype)
    q, k = q * 45, k * 45  # scores = 45^2 q.k / 8: |s| reaches ~1e4
    out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend="cpu")
    ref, ref_lse = attention_ref(q, k, v, causal=causal)
    s_max = float(np.max(np.abs(np.einsum("bqhd,bkhd->bhqk", q, np.repeat(k, 2, 2)) / 8.0)))
    assert 5e3 < s_max < 3e4, f"test setup: max |score| {s_max:.3g} should be ~1e4"
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    u = UNIT_ROUNDOFF["fp32" if dtype == np.float32 else "fp64"]
    bound = rounding_error_bound(q, k, v, causal, u_scores=u, u_store=u)
    excess = np.max(np.abs(out - ref) - bound)
    assert excess <= 0, f"error exceeds the rounding bound by {excess:.3g}"
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", NF_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
def test_cpu_nonfinite_inputs_propagate(rng, dtype, case, causal):
    b, lq, lk, h, hkv = NF_SHAPE
    q, k, v = random_qkv(rng, b, lq, lk, h, hkv, 24, dtype)
    unspecified = _poison(case, q, k, v, causal)
    out = np.full_like(q, 7.0)  # any value left behind would be a finite wrong answer
    _, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend="cpu")
    ref, ref_lse = attention_ref_ieee(q, k, v, causal=causal)
    _check_nonfinite(out, lse, ref, ref_lse, FINITE_ATOL["fp32" if dtype == np.float32 else "fp64"], unspecified)
    if case == "neg_inf_row":  # the all -inf row: zeros and LSE -inf, exactly
        assert np.all(out[1, 9, 0] == 0) and np.isneginf(lse[1, 0, 9])


def test_cpu_bitwise_reproducible_across_thread_counts(tmp_path):
    """Each output row is computed by one task whose arithmetic depends only on its index."""
    script = (
        "import sys, numpy as np, waveboost; sys.path.insert(0, {tests!r}); from reference import random_qkv\n"
        "q, k, v = random_qkv(np.random.default_rng(7), 2, 300, 333, 8, 2, 64)\n"
        "out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True)\n"
        "np.save({path!r}, np.concatenate([out.ravel(), lse.ravel()]))\n"
    )
    results = []
    for threads in ("1", "3"):
        path = str(tmp_path / f"t{threads}.npy")
        env = dict(os.environ, WAVEBOOST_NUM_THREADS=threads)
        subprocess.run([sys.executable, "-c", script.format(tests=os.path.dirname(__file__), path=path)],
                       env=env, check=True, timeout=120)
        results.append(np.load(path))
    q, k, v = random_qkv(np.random.default_rng(7), 2, 300, 333, 8, 2, 64)
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True)
    here = np.concatenate([out.ravel(), lse.ravel()])
    assert np.array_equal(results[0], results[1]) and np.array_equal(results[0], here)


# ---------------------------------------------------------------------------------------------
# GPU (through PyTorch)
# ---------------------------------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch", reason="the GPU tests drive the kernels through PyTorch")


def _require_path(path):
    """Skips where `path` cannot run at all: wgmma exists on compute capability 9.0 only."""
    torch = _torch()
    if path == "wgmma" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"backend 'wgmma' needs compute capability 9.0; this GPU has "
                    f"{'.'.join(map(str, torch.cuda.get_device_capability()))}")


def _tdtype(dname):
    torch = _torch()
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dname]


def _gpu_run(q, k, v, causal, path, scale=None):
    torch = _torch()
    out = torch.full_like(q, float("nan"))
    _, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend=path,
                                 softmax_scale=scale)
    torch.cuda.synchronize()
    return out, lse


def _gpu_bound_check(out, q, k, v, causal, scale, dname):
    from reference import attention_ref_torch

    torch = _torch()
    ref64, ref_lse = attention_ref_torch(q, k, v, causal, scale)
    assert torch.isfinite(out).all(), "non-finite output for finite inputs"
    bound = rounding_error_bound(q, k, v, causal, scale, u_scores=2.0**-24, u_store=UNIT_ROUNDOFF[dname])
    excess = ((out.double() - ref64).abs() - bound).max().item()
    assert excess <= 0, f"error exceeds the rounding bound by {excess:.3g}"
    return ref64, ref_lse


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("path,dname", GPU_PATH_DTYPES, ids=GPU_IDS)
def test_gpu_scores_up_to_1e4(path, dname, causal, d):
    torch = _torch()
    _require_path(path)
    g = torch.Generator(device=DEV).manual_seed(11 + d)
    mk = lambda *s: torch.randn(*s, generator=g, device=DEV)  # noqa: E731
    q, k, v = (mk(2, 200, 4, d) * 45).to(_tdtype(dname)), (mk(2, 333, 2, d) * 45).to(_tdtype(dname)), \
        mk(2, 333, 2, d).to(_tdtype(dname))
    scale = 1 / math.sqrt(d)
    s_max = ((q.double().transpose(1, 2) @ k.double().repeat_interleave(2, 2).transpose(1, 2).transpose(-1, -2))
             .abs().max().item() * scale)
    assert 3e3 < s_max < 3e4, f"test setup: max |score| {s_max:.3g} should be ~1e4"
    out, lse = _gpu_run(q, k, v, causal, path)
    _, ref_lse = _gpu_bound_check(out, q, k, v, causal, scale, dname)
    assert torch.isfinite(lse).all()
    assert ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp_min(1)).max().item() < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("scale_kind", ["unit", "default"], ids=["unit-scale", "default-scale"])
@pytest.mark.parametrize("path", sorted({p for p, d in GPU_PATH_DTYPES if d == "fp16"}))
def test_gpu_fp16_inputs_near_the_top_of_the_range(path, scale_kind, d, causal):
    """q, k, v uniform in +-6e4 (fp16 max 65504). "unit": scale so that scores are O(1), a smooth softmax
    over products of 3.6e9; "default": 1/sqrt(d), scores ~1e10, a one-hot softmax with v up to 65504."""
    torch = _torch()
    _require_path(path)
    g = torch.Generator(device=DEV).manual_seed(5 + d)
    uni = lambda *s: torch.rand(*s, generator=g, device=DEV) * 2 - 1  # noqa: E731
    q = (uni(1, 150, 4, d) * 6e4).half()
    k = (uni(1, 170, 2, d) * 6e4).half()
    v = (uni(1, 170, 2, d) * (65504 if scale_kind == "default" else 6e4)).half()
    # Each product has standard deviation (6e4^2 / 3); a sum of d of them, times this scale, is ~N(0, 3^2).
    scale = 3 / (6e4**2 / 3 * math.sqrt(d)) if scale_kind == "unit" else 1 / math.sqrt(d)
    out, lse = _gpu_run(q, k, v, causal, path, scale)
    _gpu_bound_check(out, q, k, v, causal, scale, "fp16")
    assert out.abs().max().item() > 3e4, "test setup: outputs should be near the top of the range"
    assert torch.isfinite(lse).all()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [NF_SHAPE, NF_SPLIT_SHAPE], ids=["short", "split"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", NF_CASES)
@pytest.mark.parametrize("path,dname", GPU_PATH_DTYPES, ids=GPU_IDS)
def test_gpu_nonfinite_inputs_propagate(path, dname, case, causal, shape):
    torch = _torch()
    _require_path(path)
    b, lq, lk, h, hkv = shape
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, b, lq, lk, h, hkv, 64, np.float32)
    unspecified = _poison(case, q, k, v, causal)
    tq, tk, tv = (torch.from_numpy(x).to(DEV).to(_tdtype(dname)) for x in (q, k, v))
    out = torch.full_like(tq, 7.0)
    _, lse = waveboost.attention(tq, tk, tv, causal=causal, out=out, return_lse=True, backend=path)
    torch.cuda.synchronize()
    # The reference sees exactly the (rounded) inputs the kernel saw.
    ref, ref_lse = attention_ref_ieee(*(x.double().cpu().numpy() for x in (tq, tk, tv)), causal=causal)
    _check_nonfinite(out.double().cpu().numpy(), lse.double().cpu().numpy(), ref, ref_lse, FINITE_ATOL[dname],
                     unspecified)
    if case == "neg_inf_row":
        assert torch.all(out[1, 9, 0] == 0) and torch.isneginf(lse[1, 0, 9])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("path,dname", GPU_PATH_DTYPES, ids=GPU_IDS)
def test_gpu_fully_masked_rows_are_zero_with_lse_minus_inf(path, dname, causal):
    """Lq > Lk with causal: rows 0..Lq-Lk-1 see no key. Lk = 0: no row sees a key, causal or not."""
    torch = _torch()
    _require_path(path)
    from reference import attention_ref_torch

    for lq, lk in ((150, 37), (33, 0)):
        g = torch.Generator(device=DEV).manual_seed(lq)
        mk = lambda *s: torch.randn(*s, generator=g, device=DEV).to(_tdtype(dname))  # noqa: E731
        q, k, v = mk(2, lq, 4, 64), mk(2, lk, 2, 64), mk(2, lk, 2, 64)
        out, lse = _gpu_run(q, k, v, causal, path)
        ref, ref_lse = attention_ref_torch(q, k, v, causal, 1 / 8)
        dead = torch.isneginf(ref_lse)  # (B, H, Lq)
        if lk == 0 or causal:
            assert dead.any()
        assert torch.equal(torch.isneginf(lse), dead) and not torch.isnan(lse).any()
        assert torch.all(out.transpose(1, 2)[dead] == 0), "rows that see no key must be exactly 0"
        assert not torch.isnan(out).any()
        live = ~dead.transpose(1, 2)
        if live.any():
            assert (out.double() - ref)[live].abs().max().item() < FINITE_ATOL[dname]


@pytest.mark.gpu
@pytest.mark.parametrize("path,dname", GPU_PATH_DTYPES, ids=GPU_IDS)
def test_gpu_bitwise_reproducible(path, dname):
    """Same inputs, same device: bitwise the same out and LSE, run to run and stream to stream."""
    torch = _torch()
    _require_path(path)
    g = torch.Generator(device=DEV).manual_seed(2)
    mk = lambda *s: torch.randn(*s, generator=g, device=DEV).to(_tdtype(dname))  # noqa: E731
    for causal in (False, True):
        q, k, v = mk(2, 515, 8, 128), mk(2, 700, 2, 128), mk(2, 700, 2, 128)
        first = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend=path)
        for i in range(3):
            stream = torch.cuda.Stream() if i == 2 else torch.cuda.current_stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                again = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend=path)
            stream.synchronize()
            assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
