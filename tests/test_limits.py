"""Size limits: tensors of more than 2^31 elements, batch * heads beyond 65535, seqlen 128k, grid limits,
overlapping outputs, and a CUDA failure (out of memory) that becomes a Python exception and leaves the
process usable.

Large cases check a sample of rows (those whose element offsets pass 2^31, where 32-bit index math
would wrap, plus the first rows) against a float64 reference computed for just those rows
(tests/reference.py:attention_ref_rows_torch). Their outputs average over many keys, so they are
compared by relative error per row; planted structure makes the rows past 2^31 dominate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import waveboost
from reference import attention_ref, attention_ref_rows_torch, attention_ref_torch, random_qkv, rel_err

DEV = "cuda"
PATHS_FP16 = ["naive", "simt", "wmma", "mma", "wgmma"]
REL_TOL = {"fp16": 1e-2, "bf16": 3e-2, "fp32": 2e-4}
TWO_31 = 2**31


def _torch():
    return pytest.importorskip("torch", reason="the GPU tests drive the kernels through PyTorch")


def _tdtype(dname):
    torch = _torch()
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dname]


def _path_runs_here(path):
    """wgmma exists on compute capability 9.0 only; every other path runs on any test GPU."""
    return path != "wgmma" or _torch().cuda.get_device_capability() == (9, 0)


def _require_path(path):
    if not _path_runs_here(path):
        pytest.skip(f"backend '{path}' needs compute capability 9.0")


def _free_memory():
    torch = _torch()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return free, total


def _need_memory(nbytes, what):
    free, _ = _free_memory()
    if free < nbytes * 1.15:
        pytest.skip(f"{what} needs {nbytes / 2**30:.1f} GiB of GPU memory; {free / 2**30:.1f} GiB free")


def _per_row_rel_err(out_rows, ref_rows):
    """max over (batch, row, head) of ||out - ref|| / ||ref|| along head_dim."""
    torch = _torch()
    diff = (out_rows.double() - ref_rows).norm(dim=-1)
    return (diff / ref_rows.norm(dim=-1).clamp_min(1e-30)).max().item()


def _check_rows(out, lse, q, k, v, rows, causal, dname, heads=None):
    """Rows `rows` (all batches) of out/lse against the float64 row reference; `heads` limits the heads."""
    torch = _torch()
    rows_t = torch.as_tensor(rows, device=q.device, dtype=torch.long)
    group = q.shape[2] // k.shape[2]
    head_list = range(q.shape[2]) if heads is None else heads
    scale = 1 / math.sqrt(q.shape[3])
    for h in head_list:
        hk = h // group
        qh, kh, vh = q[:, :, h : h + 1], k[:, :, hk : hk + 1], v[:, :, hk : hk + 1]
        ref, ref_lse = attention_ref_rows_torch(qh, kh, vh, rows_t, causal, scale)
        got = out[:, :, h : h + 1].index_select(1, rows_t)
        assert not torch.isnan(got).any(), f"head {h}: unwritten (NaN-poisoned) or NaN rows"
        err = _per_row_rel_err(got, ref)
        assert err < REL_TOL[dname], f"head {h}: per-row relative error {err:.3g}"
        got_lse = lse[:, h : h + 1].index_select(2, rows_t).double()
        assert torch.equal(torch.isneginf(got_lse), torch.isneginf(ref_lse))
        fin = torch.isfinite(ref_lse)
        if fin.any():
            assert (got_lse - ref_lse)[fin].abs().max().item() < 1e-3 * max(1.0, ref_lse[fin].abs().max().item())


def _run(q, k, v, causal, path):
    torch = _torch()
    out = torch.full_like(q, float("nan"))
    _, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend=path)
    torch.cuda.synchronize()
    return out, lse


# ---------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------


def _overlapping_views():
    f = 4  # bytes per float32
    shape = (2, 9, 4, 16)
    base = np.zeros((1, 9, 4, 16), np.float32)
    views = {"batch_stride_0": np.lib.stride_tricks.as_strided(base, shape, (0,) + base.strides[1:], writeable=True)}
    # Rows 8 elements apart but 16 wide: row i's second half is row i+1's first half.
    views["rows_overlap"] = np.lib.stride_tricks.as_strided(np.zeros(1024, np.float32), shape,
                                                            (352 * f, 8 * f, 88 * f, f), writeable=True)
    # Heads 8 elements apart, 16 wide.
    views["heads_overlap"] = np.lib.stride_tricks.as_strided(np.zeros(1152, np.float32), shape,
                                                             (576 * f, 64 * f, 8 * f, f), writeable=True)
    return views


@pytest.mark.parametrize("layout", sorted(_overlapping_views()))
def test_cpu_out_with_overlapping_elements_is_refused(rng, layout):
    q, k, v = random_qkv(rng, 2, 9, 11, 4, 2, 16)
    out = _overlapping_views()[layout]
    with pytest.raises(ValueError, match=r"out has overlapping elements .*strides"):
        waveboost.attention(q, k, v, out=out)
    assert np.all(out == 0), "nothing may be written before the refusal"


def test_cpu_broadcast_inputs_are_fine(rng):
    """Stride-0 (broadcast) inputs are valid: one K/V shared by every batch, one query row repeated."""
    q, k, v = random_qkv(rng, 1, 7, 30, 4, 2, 32)
    qb = np.broadcast_to(q[:, :1], (3, 7, 4, 32))
    kb, vb = np.broadcast_to(k, (3, 30, 2, 32)), np.broadcast_to(v, (3, 30, 2, 32))
    for causal in (False, True):
        out = waveboost.attention(qb, kb, vb, causal=causal)
        ref, _ = attention_ref(qb, kb, vb, causal=causal)
        assert rel_err(out, ref) < 1e-5


# ---------------------------------------------------------------------------------------------
# GPU: batch * heads beyond 65535
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("path,dname", [(p, "fp16") for p in PATHS_FP16] +
                         [("simt", "fp32"), ("naive", "fp32"), ("mma", "fp32"), ("wgmma", "bf16")])
def test_gpu_batch_times_heads_beyond_65535(path, dname, causal):
    """2 x 35001 heads (GQA 3:1): the flash paths fold batch * heads = 70002 over grid y and z."""
    torch = _torch()
    _require_path(path)
    g = torch.Generator(device=DEV).manual_seed(1)
    mk = lambda *s: torch.randn(*s, generator=g, device=DEV).to(_tdtype(dname))  # noqa: E731
    q, k, v = mk(2, 5, 35001, 64), mk(2, 19, 11667, 64), mk(2, 19, 11667, 64)
    out, lse = _run(q, k, v, causal, path)
    ref, ref_lse = attention_ref_torch(q, k, v, causal, 1 / 8)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    atol = {"fp16": 5e-3, "bf16": 3e-2, "fp32": 1e-5}[dname]
    err = (out.double() - ref).abs().max().item()
    assert err < atol, f"max err {err:.3g}"
    assert (lse.double() - ref_lse).abs().max().item() < 1e-3
    # The last (batch, head) pairs live past the 65535th grid row: check them explicitly.
    assert (out[1, :, -3:].double() - ref[1, :, -3:]).abs().max().item() < atol


# ---------------------------------------------------------------------------------------------
# GPU: tensors of more than 2^31 elements
# ---------------------------------------------------------------------------------------------

BIG_CASES = [(p, "fp16") for p in PATHS_FP16] + [("simt", "fp32"), ("mma", "fp32")]


@pytest.mark.gpu
@pytest.mark.parametrize("path,dname", BIG_CASES)
def test_gpu_q_and_out_over_2_31_elements_by_rows(path, dname):
    """q, out (1, 2^24 + 100, 1, 128): row offsets pass 2^31 elements from row 2^24 on."""
    torch = _torch()
    _require_path(path)
    lq, lk, d = 2**24 + 100, 96, 128
    assert lq * d > TWO_31
    esize = torch.tensor([], dtype=_tdtype(dname)).element_size()
    workspace = lq * lk * 4 if path == "naive" else 0
    _need_memory(2 * lq * d * esize + workspace + 2**30, f"{path} {dname} with q of {lq * d} elements")
    g = torch.Generator(device=DEV).manual_seed(2)
    q = torch.randn(1, lq, 1, d, generator=g, device=DEV, dtype=_tdtype(dname))
    k = torch.randn(1, lk, 1, d, generator=g, device=DEV, dtype=_tdtype(dname))
    v = torch.randn(1, lk, 1, d, generator=g, device=DEV, dtype=_tdtype(dname))
    for causal in (False, True):
        out, lse = _run(q, k, v, causal, path)
        assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) output elements"
        rows = [0, 1, 2, 2**24 - 2, 2**24 - 1, 2**24, 2**24 + 1] + list(range(lq - 100, lq))
        _check_rows(out, lse, q, k, v, rows, causal, dname)
        del out, lse
    del q, k, v
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("path,dname", BIG_CASES)
def test_gpu_q_and_out_over_2_31_elements_by_batch(path, dname):
    """q, out (65539, 128, 2, 128), GQA 2:1: batch offsets pass 2^31 and batch * heads = 131078 > 65535."""
    torch = _torch()
    _require_path(path)
    b, lq, lk, h, d = 65539, 128, 64, 2, 128
    assert b * lq * h * d > TWO_31
    esize = torch.tensor([], dtype=_tdtype(dname)).element_size()
    workspace = b * h * lq * lk * 4 if path == "naive" else 0
    _need_memory((2 * b * lq * h * d + 2 * b * lk * d) * esize + workspace + 2**30, f"{path} {dname} batch 65539")
    g = torch.Generator(device=DEV).manual_seed(3)
    q = torch.randn(b, lq, h, d, generator=g, device=DEV, dtype=_tdtype(dname))
    k = torch.randn(b, lk, 1, d, generator=g, device=DEV, dtype=_tdtype(dname))
    v = torch.randn(b, lk, 1, d, generator=g, device=DEV, dtype=_tdtype(dname))
    out, lse = _run(q, k, v, True, path)
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) output elements"
    batches = torch.tensor([0, 1, 32767, 65535, 65536, 65537, 65538], device=DEV)
    sub = lambda x: x.index_select(0, batches)  # noqa: E731
    _check_rows(sub(out), sub(lse), sub(q), sub(k), sub(v), list(range(lq)), True, dname)
    del q, k, v, out, lse
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("path,dname", BIG_CASES + [("naive", "fp32")])
def test_gpu_k_and_v_over_2_31_elements(path, dname):
    """k, v (1, 2^17 + 4096, 128, 128): key rows from 2^17 on sit past 2^31 elements. Those keys are
    scaled up so that they dominate every softmax: reading them from a wrapped offset cannot pass."""
    torch = _torch()
    _require_path(path)
    lq, lk, h, d = 64, 2**17 + 4096, 128, 128
    assert lk * h * d > TWO_31
    esize = torch.tensor([], dtype=_tdtype(dname)).element_size()
    workspace = h * lq * lk * 4 if path == "naive" else 0
    _need_memory(2 * lk * h * d * esize + workspace + 2**30, f"{path} {dname} with k of {lk * h * d} elements")
    g = torch.Generator(device=DEV).manual_seed(4)
    q = torch.randn(1, lq, h, d, generator=g, device=DEV, dtype=_tdtype(dname))
    k = torch.randn(1, lk, h, d, generator=g, device=DEV, dtype=_tdtype(dname))
    v = torch.randn(1, lk, h, d, generator=g, device=DEV, dtype=_tdtype(dname))
    k[:, 2**17 :] *= 3
    for causal in (False, True):
        out, lse = _run(q, k, v, causal, path)
        assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) output elements"
        _check_rows(out, lse, q, k, v, list(range(lq)), causal, dname, heads=[0, 77, 127])
        del out, lse
    del q, k, v
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# GPU: seqlen 128k
# ---------------------------------------------------------------------------------------------

LONG = 2**17
LONG_ROWS = [0, 1, 2, 3, 1000, 65535, 65536] + list(range(LONG - 64, LONG))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "path,dname,d,heads,causal",
    [("mma", "fp16", 128, 2, True), ("mma", "bf16", 64, 2, False), ("wmma", "bf16", 128, 2, True),
     ("wmma", "fp16", 64, 1, False), ("simt", "fp32", 64, 1, True), ("simt", "bf16", 128, 1, True),
     ("mma", "fp32", 128, 1, True), ("wgmma", "fp16", 64, 2, True), ("wgmma", "bf16", 128, 1, False)],
    ids=lambda x: str(x),
)
def test_gpu_seqlen_128k(path, dname, d, heads, causal):
    torch = _torch()
    _require_path(path)
    g = torch.Generator(device=DEV).manual_seed(5)
    q = torch.randn(1, LONG, heads, d, generator=g, device=DEV, dtype=_tdtype(dname))
    k = torch.randn(1, LONG, 1, d, generator=g, device=DEV, dtype=_tdtype(dname))
    v = torch.randn(1, LONG, 1, d, generator=g, device=DEV, dtype=_tdtype(dname))
    out, lse = _run(q, k, v, causal, path)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    _check_rows(out, lse, q, k, v, LONG_ROWS, causal, dname)


@pytest.mark.gpu
def test_gpu_seqlen_128k_naive():
    """naive materializes 2^34 float32 scores (64 GiB) at 128k x 128k: it runs where they fit, and where
    they do not, it raises CUDA's out-of-memory error instead of computing anything."""
    torch = _torch()
    workspace = LONG * LONG * 4
    free, total = _free_memory()
    g = torch.Generator(device=DEV).manual_seed(6)
    q, k, v = (torch.randn(1, LONG, 1, 64, generator=g, device=DEV, dtype=torch.float16) for _ in range(3))
    if workspace > total:
        with pytest.raises(RuntimeError, match=r"out of memory"):
            waveboost.attention(q, k, v, causal=True, backend="naive")
        return
    if workspace > 0.9 * free:
        pytest.skip(f"naive at 128k needs a 64 GiB workspace; {free / 2**30:.1f} GiB free of {total / 2**30:.1f}: "
                    "too close to call whether cudaMallocAsync succeeds")
    out, lse = _run(q, k, v, True, "naive")
    _check_rows(out, lse, q, k, v, LONG_ROWS, True, "fp16")


# ---------------------------------------------------------------------------------------------
# GPU: grid limits refused clearly (broadcast views give huge batch * heads without memory)
# ---------------------------------------------------------------------------------------------


def _broadcast_qkv(batch, heads, seqlen, d=64, dname="fp16"):
    torch = _torch()
    q = torch.randn(1, 1, 1, d, device=DEV, dtype=_tdtype(dname)).expand(batch, seqlen, heads, d)
    k = torch.randn(1, 1, 1, d, device=DEV, dtype=_tdtype(dname)).expand(batch, seqlen, 1, d)
    return q, k, k


# The folded-grid paths (batch * heads over grid y and z): the limit, the word "grid", the value.
FOLDED_GRID_REFUSAL = r"backend '{}' supports batch \* heads up to 4294836225 .*grid.*got batch \* heads 4294967296"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "path,dname,message",
    [
        ("simt", "fp16", (r"backend 'simt' launches batch \* heads \* ceil\(seqlen_q / 64\) blocks in grid x, "
                          r"at most 2147483647; got batch \* heads 4294967296")),
        ("wmma", "fp16", FOLDED_GRID_REFUSAL.format("wmma")),
        ("mma", "fp16", FOLDED_GRID_REFUSAL.format("mma")),
        ("mma", "fp32", FOLDED_GRID_REFUSAL.format("mma")),
        ("wgmma", "fp16", FOLDED_GRID_REFUSAL.format("wgmma")),
    ],
    ids=["simt-fp16", "wmma-fp16", "mma-fp16", "mma-fp32", "wgmma-fp16"],
)
def test_gpu_grid_limit_refused_with_the_limit(path, dname, message):
    _require_path(path)
    q, k, v = _broadcast_qkv(65536, 65536, 1, dname=dname)
    with pytest.raises(ValueError, match=message):
        waveboost.resolve_backend(q, k, v, backend=path)
    # "auto" sees the refusal too: no flash path can launch this, so it ends at naive (or refuses).
    try:
        assert waveboost.resolve_backend(q, k, v) == "naive"
    except ValueError:
        pass


@pytest.mark.gpu
def test_gpu_naive_workspace_size_overflow_refused():
    """batch * heads * seqlen_q * seqlen_k = 2^64 floats would wrap int64 to a 0-byte workspace."""
    q, k, v = _broadcast_qkv(65536, 65536, 65536)
    with pytest.raises(ValueError, match=r"backend 'naive' materializes .* more than 2\^62 bytes"):
        waveboost.resolve_backend(q, k, v, backend="naive")


@pytest.mark.gpu
def test_gpu_out_with_overlapping_elements_is_refused():
    torch = _torch()
    q = torch.randn(2, 9, 4, 64, device=DEV, dtype=torch.float16)
    out = torch.zeros(1, 9, 4, 64, device=DEV, dtype=torch.float16).expand(2, 9, 4, 64)
    with pytest.raises(ValueError, match=r"out has overlapping elements"):
        waveboost.attention(q, q[:, :, :2], q[:, :, :2], out=out)


# ---------------------------------------------------------------------------------------------
# GPU: a CUDA failure is a Python exception with CUDA's message; the next call works
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_out_of_memory_is_a_runtime_error_and_the_next_call_works():
    torch = _torch()
    _, total = _free_memory()
    b, h, lq, lk, d = 1, 64, 32768, 32768, 64
    assert b * h * lq * lk * 4 > 1.5 * total, "test setup: the naive workspace must exceed device memory"
    g = torch.Generator(device=DEV).manual_seed(7)
    q = torch.randn(b, lq, h, d, generator=g, device=DEV, dtype=torch.float16)
    k = torch.randn(b, lk, 8, d, generator=g, device=DEV, dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"cudaMallocAsync of the naive score workspace .*out of memory"):
        waveboost.attention(q, k, k, backend="naive")
    # The process is usable: the same and every other path run correctly right after.
    q2, k2, v2 = (torch.randn(2, 97, 4, 64, generator=g, device=DEV, dtype=torch.float16) for _ in range(3))
    ref, _ = attention_ref_torch(q2, k2, v2, True, 1 / 8)
    for path in filter(_path_runs_here, PATHS_FP16):
        out = waveboost.attention(q2, k2, v2, causal=True, backend=path)
        torch.cuda.synchronize()
        assert (out.double() - ref).abs().max().item() < 5e-3, path
