"""CUDA backward passes (naive, mma, wgmma) against a float64 reference.

The reference is the same plain PyTorch attention (masked softmax, P V) differentiated by autograd
in float64 on the GPU. Half precision follows FlashAttention's rule per gradient:
max|g - ref| <= 2 * max|g_torch - ref| + atol, where g_torch comes from that implementation run
in the input dtype. fp32 (naive, mma's 3xTF32): relative Frobenius error < 1e-5 per gradient. The kernels get
the out and lse of waveboost's own forward on the same path, as a training step would.
"""

from __future__ import annotations

import math

import pytest

import waveboost

torch = pytest.importorskip("torch", reason="the GPU tests drive the kernels through PyTorch")

pytestmark = pytest.mark.gpu

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
ATOL = {"fp16": 2e-4, "bf16": 2e-3}
PATHS = {"naive": (["fp16", "bf16", "fp32"], [64, 128, 40]), "mma": (["fp16", "bf16", "fp32"], [64, 128]),
         "wgmma": (["fp16", "bf16"], [64, 128])}
HEADS = 8
GROUPS = [1, 2, 8]
# (seqlen_q, seqlen_k): equal and unequal both ways, tails of every tile size.
LENGTHS = [(1, 1), (7, 7), (97, 97), (257, 257), (1025, 1025), (97, 257), (257, 97), (1, 1025), (1025, 7),
           (7, 1025)]


def case_params():
    out = []
    for path, (dnames, dims) in PATHS.items():
        for dname in dnames:
            for d in dims:
                for li, (lq, lk) in enumerate(LENGTHS):
                    for causal in (False, True):
                        out.append(pytest.param(path, dname, d, lq, lk, causal,
                                                id=f"{path}-{dname}-d{d}-{lq}x{lk}-{'causal' if causal else 'full'}"))
    return out


def torch_attention(q, k, v, causal, scale):
    """Plain attention in q's dtype (BSHD, GQA by repeat): (out, lse). Rows that see no key give
    zeros (and an lse that no gradient flows through)."""
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // hkv, dim=2)
    v = v.repeat_interleave(h // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if causal:
        mask = torch.arange(lk, device=q.device)[None, :] <= torch.arange(lq, device=q.device)[:, None] + (lk - lq)
    rows_any = mask.any(-1, keepdim=True)
    s = torch.where(mask, s, float("-inf"))
    s = torch.where(rows_any, s, 0.0)
    p = torch.softmax(s, dim=-1) * rows_any
    lse = torch.where(rows_any[..., 0], torch.logsumexp(s, dim=-1), 0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), v), lse


def torch_grads(q, k, v, dout, causal, scale, dtype, dlse=None):
    leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    out, lse = torch_attention(*leaves, causal, scale)
    if dlse is None:
        return torch.autograd.grad(out, leaves, dout.to(dtype))
    return torch.autograd.grad((out, lse), leaves, (dout.to(dtype), dlse.to(lse.dtype)))


def random_inputs(b, lq, lk, h, hkv, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=torch.float32).to(dtype)  # noqa: E731
    return mk(b, lq, h, d), mk(b, lk, hkv, d), mk(b, lk, hkv, d), mk(b, lq, h, d)


def nan_like(x):
    return torch.full_like(x, float("nan"))


def skip_unless_runs(path):
    if path == "wgmma" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("backend 'wgmma' runs on compute capability 9.0 only")


def run_backward(path, q, k, v, dout, causal, scale=None, dlse=None, deterministic=False, fwd_path=None):
    skip_unless_runs(path)
    out, lse = waveboost.attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True,
                                   backend=fwd_path or path)
    dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)  # every element must be written
    res = waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, softmax_scale=scale, dlse=dlse,
                                       dq=dq, dk=dk, dv=dv, deterministic=deterministic, backend=path)
    torch.cuda.synchronize()
    return res


def scale_of_terms(q, k, v, dout, name, scale):
    """An upper bound on one row's |P * dP| times |K| (dq) or |Q| (dk) times |scale|, or |dO| (dv)."""
    dp = dout.abs().max().item() * v.abs().max().item() * q.shape[-1]
    if name == "dv":
        return dout.abs().max().item()
    return dp * (k if name == "dq" else q).abs().max().item() * abs(scale)


def check_grads(grads, q, k, v, dout, causal, scale, dname, dlse=None):
    ref = torch_grads(q, k, v, dout, causal, scale, torch.float64, dlse)
    base = torch_grads(q, k, v, dout, causal, scale, q.dtype, dlse) if dname != "fp32" else None
    for name, g, r, i in zip(("dq", "dk", "dv"), grads, ref, range(3)):
        assert g.shape == r.shape and g.dtype == q.dtype, name
        assert not torch.isnan(g).any().item(), f"{name}: unwritten (NaN-poisoned) or NaN elements"
        if g.numel() == 0:
            continue
        err = (g.double() - r).abs().max().item()
        if dname == "fp32":
            # Relative to the gradient, or, where the exact gradient is 0 up to rounding (one key
            # and no dlse: dP = D and dS = 0), relative to the terms that cancel: |P dP| |K| scale.
            rel = ((g.double() - r).norm() / r.norm().clamp_min(1e-300)).item()
            terms = scale_of_terms(q, k, v, dout, name, scale)
            assert rel < 1e-5 or (r.abs().max().item() < 1e-12 * terms and err < 1e-5 * terms), \
                f"{name}: fp32 relative error {rel:.3g} (max abs {err:.3g})"
        else:
            base_err = (base[i].double() - r).abs().max().item()
            bound = 2 * base_err + ATOL[dname] * max(1.0, r.abs().max().item())
            assert err <= bound, f"{name}: max error {err:.4g} > 2 x torch {dname} error {base_err:.4g} + atol"


@pytest.mark.parametrize("path,dname,d,lq,lk,causal", case_params())
def test_matches_reference(path, dname, d, lq, lk, causal):
    idx = LENGTHS.index((lq, lk))
    b = 3 if idx % 2 == 0 else 1
    hkv = HEADS // GROUPS[idx % 3]
    dtype = DTYPES[dname]
    q, k, v, dout = random_inputs(b, lq, lk, HEADS, hkv, d, dtype, seed=idx * 1000 + d + 7 * int(causal))
    scale = 1.0 / math.sqrt(d)
    grads = run_backward(path, q, k, v, dout, causal)
    check_grads(grads, q, k, v, dout, causal, scale, dname)


@pytest.mark.parametrize("path,dname", [("naive", "fp16"), ("naive", "fp32"), ("mma", "bf16"), ("mma", "fp16"),
                                        ("mma", "fp32"), ("wgmma", "bf16"), ("wgmma", "fp16")])
@pytest.mark.parametrize("groups", GROUPS)
def test_gqa_groups(path, dname, groups):
    q, k, v, dout = random_inputs(2, 200, 333, HEADS, HEADS // groups, 64, DTYPES[dname], seed=groups)
    for causal in (False, True):
        grads = run_backward(path, q, k, v, dout, causal)
        check_grads(grads, q, k, v, dout, causal, 1 / 8, dname)


@pytest.mark.parametrize("path,dname", [("naive", "fp32"), ("naive", "bf16"), ("mma", "fp16"), ("mma", "bf16"),
                                        ("mma", "fp32"), ("wgmma", "fp16"), ("wgmma", "bf16")])
@pytest.mark.parametrize("lq,lk", [(130, 70), (70, 130), (64, 64)])
def test_dlse_and_empty_rows(path, dname, lq, lk):
    """dS += dlse * P; causal with seqlen_q > seqlen_k leaves rows with no key: zero gradients, no NaN."""
    dtype = DTYPES[dname]
    d = 64
    q, k, v, dout = random_inputs(2, lq, lk, 4, 2, d, dtype, seed=lq + lk)
    g = torch.Generator(device="cuda").manual_seed(5)
    dlse = torch.randn(2, 4, lq, generator=g, device="cuda", dtype=torch.float32)
    for causal in (False, True):
        dq, dk, dv = run_backward(path, q, k, v, dout, causal, dlse=dlse)
        check_grads((dq, dk, dv), q, k, v, dout, causal, 1 / 8, dname, dlse=dlse)
        if causal and lq > lk:
            assert (dq[:, : lq - lk] == 0).all().item(), "rows that see no key must get zero dq"


@pytest.mark.parametrize("path,dname", [("mma", "bf16"), ("mma", "fp32"), ("wgmma", "bf16")])
def test_causal_launch_order(path, dname):
    """Causal grids take their last kv heads key block by key block, enough of them for two blocks
    per SM, and the others head by head (core/schedule.cuh): 96 kv heads of 6 key blocks put heads
    in both parts on any GPU up to 200 SMs."""
    q, k, v, dout = random_inputs(8, 200, 700, 24, 12, 128, DTYPES[dname], seed=11)
    grads = run_backward(path, q, k, v, dout, True)
    check_grads(grads, q, k, v, dout, True, 1 / math.sqrt(128), dname)


@pytest.mark.parametrize("path", ["naive", "mma", "wgmma"])
def test_strided_views(path):
    """BHSD storage seen through transposes, for every input and output."""
    skip_unless_runs(path)
    dtype = torch.bfloat16
    b, lq, lk, h, hkv, d = 2, 97, 131, 4, 2, 128
    mk = lambda bb, l, hh: torch.randn(bb, hh, l, d, device="cuda").to(dtype).transpose(1, 2)  # noqa: E731
    q, k, v, dout = mk(b, lq, h), mk(b, lk, hkv), mk(b, lk, hkv), mk(b, lq, h)
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True, backend=path)
    dq = torch.full((b, h, lq, d), float("nan"), device="cuda", dtype=dtype).transpose(1, 2)
    dk = torch.full((b, hkv, lk, d), float("nan"), device="cuda", dtype=dtype).transpose(1, 2)
    dv = torch.full((b, hkv, lk, d), float("nan"), device="cuda", dtype=dtype).transpose(1, 2)
    waveboost.attention_backward(dout, q, k, v, out, lse, causal=True, dq=dq, dk=dk, dv=dv, backend=path)
    torch.cuda.synchronize()
    check_grads((dq, dk, dv), q, k, v, dout, True, 1 / math.sqrt(d), "bf16")


def test_naive_unaligned_views_and_mma_refusal():
    """Rows that start 2 bytes past 16 B: naive takes them; mma refuses with the reason."""
    dtype = torch.float16
    b, lq, lk, h, d = 1, 33, 45, 2, 64
    mk = lambda l: torch.randn(b, l, h, d + 1, device="cuda").to(dtype)[..., 1:]  # noqa: E731
    q, k, v, dout = mk(lq), mk(lk), mk(lk), mk(lq)
    grads = run_backward("naive", q, k, v, dout, False)
    check_grads(grads, q, k, v, dout, False, 1 / 8, "fp16")
    out, lse = waveboost.attention(q, k, v, return_lse=True, backend="naive")
    with pytest.raises(ValueError, match="16-byte aligned"):
        waveboost.attention_backward(dout, q, k, v, out, lse, backend="mma")


@pytest.mark.parametrize("dname,d,reason", [("fp32", 96, "head_dim 64 and 128"), ("fp16", 96, "head_dim 64 and 128")])
def test_mma_refuses_with_reason(dname, d, reason):
    q, k, v, dout = random_inputs(1, 16, 16, 2, 2, d, DTYPES[dname], seed=1)
    out, lse = waveboost.attention(q, k, v, return_lse=True, backend="naive")
    with pytest.raises(ValueError, match=reason):
        waveboost.attention_backward(dout, q, k, v, out, lse, backend="mma")


@pytest.mark.parametrize("path,dname", [("naive", "fp32"), ("naive", "fp16"), ("mma", "bf16"), ("mma", "fp32"),
                                        ("wgmma", "fp16")])
@pytest.mark.parametrize("scale", [-0.3, 0.0, 2.0])
def test_unusual_scales(path, dname, scale):
    q, k, v, dout = random_inputs(1, 97, 130, 4, 1, 64, DTYPES[dname], seed=11)
    for causal in (False, True):
        grads = run_backward(path, q, k, v, dout, causal, scale=scale)
        check_grads(grads, q, k, v, dout, causal, scale, dname)


@pytest.mark.parametrize("path", ["naive", "mma", "wgmma"])
@pytest.mark.parametrize("lq,lk", [(0, 50), (50, 0)])
def test_empty_sequences(path, lq, lk):
    skip_unless_runs(path)
    q, k, v, dout = random_inputs(2, lq, lk, 4, 2, 64, torch.float16, seed=3)
    out = torch.zeros_like(q)
    lse = torch.full((2, 4, lq), float("-inf"), device="cuda")
    dq, dk, dv = waveboost.attention_backward(dout, q, k, v, out, lse, dq=nan_like(q), dk=nan_like(k), dv=nan_like(v),
                                              backend=path)
    torch.cuda.synchronize()
    for g in (dq, dk, dv):
        assert (g == 0).all().item()


@pytest.mark.parametrize("path,dname,d", [("naive", "fp16", 64), ("mma", "bf16", 64), ("mma", "fp16", 128),
                                          ("mma", "bf16", 128), ("mma", "fp32", 64), ("mma", "fp32", 128),
                                          ("wgmma", "fp16", 64), ("wgmma", "bf16", 64), ("wgmma", "fp16", 128),
                                          ("wgmma", "bf16", 128)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(700, 900), (900, 700), (1, 300), (2100, 4100)])
def test_deterministic_bitwise(path, dname, d, causal, lq, lk):
    skip_unless_runs(path)
    if path == "naive" and lk > 1000:
        pytest.skip("the naive backward's workspace grows with seqlen_q x seqlen_k; its order is fixed at any size")
    # (2100, 4100): 33 key blocks add into each query block of 8 query heads, over many waves.
    q, k, v, dout = random_inputs(2, lq, lk, 8, 2, d, DTYPES[dname], seed=d + lq)
    out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend=path)
    runs = []
    for _ in range(3):
        runs.append(waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True,
                                                 backend=path))
    torch.cuda.synchronize()
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), "deterministic=True must be bitwise stable"
    check_grads(runs[0], q, k, v, dout, causal, 1 / math.sqrt(d), dname)
    # The default (atomic dQ) agrees with the deterministic result to rounding.
    fast = waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, backend=path)
    torch.cuda.synchronize()
    for a, b in zip(runs[0], fast):
        assert torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2)



def test_wgmma_deterministic_runs_on_its_tma_kernel(monkeypatch):
    """deterministic=True runs on wgmma's warp-specialized kernel, whose writer warp adds dQ in a fixed
    order (auto takes it on Hopper); the cp.async kernel adds dQ with atomics, so with it selected
    wgmma refuses deterministic=True with the reason and auto runs mma's."""
    skip_unless_runs("wgmma")
    q, k, v, dout = random_inputs(1, 300, 300, 4, 2, 64, torch.bfloat16, seed=2)
    out, lse = waveboost.attention(q, k, v, return_lse=True)
    assert waveboost.resolve_backend(q, k, v, backward=True, deterministic=True) == "wgmma"
    auto = waveboost.attention_backward(dout, q, k, v, out, lse, deterministic=True)
    wgmma = waveboost.attention_backward(dout, q, k, v, out, lse, deterministic=True, backend="wgmma")
    torch.cuda.synchronize()
    for a, b in zip(auto, wgmma):
        assert torch.equal(a, b)
    monkeypatch.setenv("WAVEBOOST_WGMMA_BACKWARD", "cp.async")
    with pytest.raises(ValueError, match="deterministic"):
        waveboost.attention_backward(dout, q, k, v, out, lse, deterministic=True, backend="wgmma")
    assert waveboost.resolve_backend(q, k, v, backward=True, deterministic=True) == "mma"


def test_auto_backward_on_hopper_is_wgmma():
    """auto resolves to the wgmma backward on compute capability 9.0, and runs it."""
    skip_unless_runs("wgmma")
    q, k, v, dout = random_inputs(2, 300, 300, 4, 2, 128, torch.float16, seed=4)
    assert waveboost.resolve_backend(q, k, v, causal=True, backward=True) == "wgmma"
    q64, k64, v64, _ = random_inputs(2, 300, 300, 4, 2, 64, torch.float16, seed=5)
    assert waveboost.resolve_backend(q64, k64, v64, causal=False, backward=True) == "wgmma"
    assert waveboost.resolve_backend(q64, k64, v64, causal=True, backward=True) == "wgmma"
    grads = run_backward("auto", q, k, v, dout, True)
    check_grads(grads, q, k, v, dout, True, 1 / math.sqrt(128), "fp16")


@pytest.mark.parametrize("pipeline", ["tma", "cp.async"])
@pytest.mark.parametrize("dname,d", [("bf16", 64), ("fp16", 128), ("bf16", 128), ("fp16", 64)])
def test_wgmma_main_kernels(monkeypatch, pipeline, dname, d):
    """Each of the wgmma backward's main kernels (WAVEBOOST_WGMMA_BACKWARD, read at every call) on
    tails, Lq != Lk both ways, GQA/MQA, many steps per key block, causal and not."""
    skip_unless_runs("wgmma")
    monkeypatch.setenv("WAVEBOOST_WGMMA_BACKWARD", pipeline)
    for i, (b, lq, lk, hkv) in enumerate(((2, 300, 260, 2), (1, 97, 1025, 8), (3, 1025, 97, 1), (1, 700, 700, 4))):
        q, k, v, dout = random_inputs(b, lq, lk, HEADS, hkv, d, DTYPES[dname], seed=100 * i + d)
        for causal in (False, True):
            grads = run_backward("wgmma", q, k, v, dout, causal)
            check_grads(grads, q, k, v, dout, causal, 1 / math.sqrt(d), dname)


@pytest.mark.parametrize("dname,d,rows", [("bf16", 128, None), ("fp16", 128, None), ("bf16", 64, None),
                                           ("fp16", 64, None), ("bf16", 64, "64"), ("fp16", 64, "64")])
def test_mma_main_kernel_steps(monkeypatch, dname, d, rows):
    """The 16-bit mma backward's main kernel (128 keys per block; 64 query rows per step at head dim
    128, 128 at head dim 64, and 64 there with WAVEBOOST_MMA_BACKWARD_ROWS=64: the form of devices with
    less shared memory per block) on tails of both blocks, Lq != Lk both ways, GQA/MQA, many steps per
    key block, causal and not, a gradient into lse, and deterministic=True bitwise stable run to run."""
    if rows is not None:
        monkeypatch.setenv("WAVEBOOST_MMA_BACKWARD_ROWS", rows)
    scale = 1 / math.sqrt(d)
    for i, (b, lq, lk, hkv) in enumerate(((2, 300, 260, 2), (1, 97, 1025, 8), (3, 1025, 97, 1), (1, 700, 700, 4),
                                          (2, 1100, 2100, 2))):
        q, k, v, dout = random_inputs(b, lq, lk, HEADS, hkv, d, DTYPES[dname], seed=100 * i + d)
        for causal in (False, True):
            grads = run_backward("mma", q, k, v, dout, causal)
            check_grads(grads, q, k, v, dout, causal, scale, dname)
    q, k, v, dout = random_inputs(2, 130, 70, HEADS, 2, d, DTYPES[dname], seed=11)
    dlse = torch.randn(2, HEADS, 130, device="cuda", dtype=torch.float32)
    for causal in (False, True):
        grads = run_backward("mma", q, k, v, dout, causal, dlse=dlse)
        check_grads(grads, q, k, v, dout, causal, scale, dname, dlse=dlse)
    q, k, v, dout = random_inputs(2, 700, 900, 8, 2, d, DTYPES[dname], seed=13)
    for causal in (False, True):
        out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend="mma")
        runs = [waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True,
                                             backend="mma") for _ in range(3)]
        torch.cuda.synchronize()
        for other in runs[1:]:
            for a, b in zip(runs[0], other):
                assert torch.equal(a.view(torch.int16), b.view(torch.int16)), "bitwise stable run to run"
        check_grads(runs[0], q, k, v, dout, causal, scale, dname)

