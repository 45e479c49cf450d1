"""CUDA paths against the float64 reference (FlashAttention's half-precision rule).

Half precision: max|out - ref| <= 2 * max|same_dtype_naive - ref| + atol, where
same_dtype_naive is a plain softmax(QK^T)V computed in the input dtype.
fp32: Frobenius relative error well under 1e-4.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import waveboost
from reference import attention_ref_torch as reference, torch_from_jax

torch = pytest.importorskip("torch", reason="the GPU tests drive the kernels through PyTorch")

pytestmark = pytest.mark.gpu

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
ATOL = {"fp16": 2e-4, "bf16": 2e-3}
PATH_DTYPES = {
    "naive": ["fp16", "bf16", "fp32"],
    "simt": ["fp16", "bf16", "fp32"],
    "wmma": ["fp16", "bf16"],
    "mma": ["fp16", "bf16", "fp32"],
    "wgmma": ["fp16", "bf16"],
}
CUDA_PATHS = list(PATH_DTYPES)
HALF_ONLY_PATHS = ["wmma", "wgmma"]
HEAD_DIMS = [64, 128]
GROUPS = [1, 2, 8]  # heads // heads_kv
HEADS = 8
# (seqlen_q, seqlen_k): awkward lengths, both equal and unequal in both directions.
LENGTHS = [(1, 1), (7, 7), (97, 97), (257, 257), (1025, 1025), (4097, 4097), (97, 257), (257, 97), (1, 1025),
           (1025, 7)]


def random_qkv(b, lq, lk, h, hkv, d, dtype, device="cuda"):
    g = torch.Generator(device=device)
    g.manual_seed(hash((b, lq, lk, h, hkv, d, str(dtype))) % 2**31)
    mk = lambda *s: torch.randn(*s, generator=g, device=device, dtype=torch.float32).to(dtype)  # noqa: E731
    return mk(b, lq, h, d), mk(b, lk, hkv, d), mk(b, lk, hkv, d)


def poison_allocator(nbytes):
    """Leave NaNs in the caching allocator's next block so unwritten lse elements show up."""
    t = torch.full((nbytes // 4 + 1,), float("nan"), device="cuda")
    del t


def check_against_reference(out, lse, q, k, v, causal, scale, dname):
    ref, ref_lse = reference(q, k, v, causal, scale)
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) or NaN output elements"
    assert not torch.isnan(lse).any(), "unwritten or NaN lse elements"
    err = (out.double() - ref).abs().max().item() if out.numel() else 0.0
    if dname == "fp32":
        rel = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        assert rel < 1e-5, f"fp32 relative error {rel:.3g}"
    else:
        naive, _ = reference(q, k, v, causal, scale, dtype=q.dtype)
        naive_err = (naive.double() - ref).abs().max().item() if out.numel() else 0.0
        assert err <= 2 * naive_err + ATOL[dname], f"max err {err:.3g} vs same-dtype naive {naive_err:.3g}"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "rows with no visible key need LSE -inf"
    finite = torch.isfinite(ref_lse)
    lse_err = (lse.double() - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
    assert lse_err <= (1e-4 if dname == "fp32" else 1e-3) * max(1.0, ref_lse[finite].abs().max().item())


def run_case(path, dname, d, causal, group, lq, lk, batch=None):
    dtype = DTYPES[dname]
    b = batch if batch is not None else (2 if max(lq, lk) <= 257 else 1)
    q, k, v = random_qkv(b, lq, lk, HEADS, HEADS // group, d, dtype)
    out = torch.full_like(q, float("nan"))
    poison_allocator(b * HEADS * lq * 4)
    res, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend=path)
    torch.cuda.synchronize()
    assert res is out and lse.dtype == torch.float32 and lse.shape == (b, HEADS, lq)
    check_against_reference(out, lse, q, k, v, causal, 1 / math.sqrt(d), dname)


MATRIX = [
    (path, dname, d, causal, group, lq, lk)
    for path, dnames in PATH_DTYPES.items()
    for dname in dnames
    for d in HEAD_DIMS
    for causal in (False, True)
    for group in GROUPS
    for lq, lk in LENGTHS
]


@pytest.mark.parametrize(
    "path,dname,d,causal,group,lq,lk",
    MATRIX,
    ids=[f"{p}-{n}-d{d}-{'causal' if c else 'full'}-g{g}-{lq}x{lk}" for p, n, d, c, g, lq, lk in MATRIX],
)
def test_cuda_path_matches_reference(path, dname, d, causal, group, lq, lk):
    run_case(path, dname, d, causal, group, lq, lk)


# Small grids with long keys, where wgmma cuts each block's keys into pieces merged by a second
# kernel (split-KV): (batch, heads, heads_kv, seqlen_q, seqlen_k), with the pieces on an H100.
SPLIT_SHAPES = [
    (1, 8, 1, 1, 5000, "decoding, MQA: 8 blocks x 14 pieces of 3 tiles"),
    (1, 2, 1, 300, 1000, "GQA: 6 blocks x 8 pieces of 1 tile"),
    (1, 1, 1, 1100, 900, "Lq > Lk: causal leaves rows with no key; 9 blocks x 8 pieces"),
    (2, 4, 2, 129, 4097, "16 blocks x 7 pieces of up to 5 tiles, the last tile of one key"),
    (1, 1, 1, 1, 769, "one row, 7 pieces, the last of one key"),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dname", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=[s[-1].split(":")[0] for s in SPLIT_SHAPES])
def test_wgmma_split_kv_matches_reference(shape, dname, d, causal):
    b, h, hkv, lq, lk, _ = shape
    q, k, v = random_qkv(b, lq, lk, h, hkv, d, DTYPES[dname])
    try:
        waveboost.resolve_backend(q, k, v, backend="wgmma")
    except ValueError as e:
        pytest.skip(f"backend 'wgmma' cannot run on this GPU: {e}")
    # The split ran wherever the grid (blocks of 128 query rows) leaves over half of the SMs idle.
    blocks = b * h * -(-lq // 128)
    if 2 * blocks <= torch.cuda.get_device_properties(0).multi_processor_count:
        plan = waveboost.plan(q, k, v, causal=causal, backend="wgmma")
        assert plan["num_splits"] > 1 and plan["kernel"] == f"wgmma_hdim{d}_{dname}", plan
    out = torch.full_like(q, float("nan"))
    poison_allocator(b * h * lq * 4)
    _, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend="wgmma")
    torch.cuda.synchronize()
    check_against_reference(out, lse, q, k, v, causal, 1 / math.sqrt(d), dname)
    assert torch.equal(waveboost.attention(q, k, v, causal=causal, backend="wgmma"), out), "not deterministic"


@pytest.mark.parametrize("path,dname", [("wmma", "fp16"), ("mma", "bf16"), ("mma", "fp32"), ("wgmma", "bf16"),
                                        ("wgmma", "fp16")])
def test_causal_launch_order(path, dname):
    """Causal grids take their last heads tile by tile, enough of them for two blocks per SM, and the
    others head by head (core/schedule.cuh): 160 heads of 3 query blocks put heads in both parts on
    any GPU up to 200 SMs (no split-KV)."""
    b, h, lq, lk, d = 10, 16, 300, 700, 128
    q, k, v = random_qkv(b, lq, lk, h, h // 2, d, DTYPES[dname])
    try:
        waveboost.resolve_backend(q, k, v, causal=True, backend=path)
    except ValueError as e:
        pytest.skip(f"backend {path!r} cannot run this case: {e}")
    assert waveboost.plan(q, k, v, causal=True, backend=path)["num_splits"] == 1
    out = torch.full_like(q, float("nan"))
    poison_allocator(b * h * lq * 4)
    _, lse = waveboost.attention(q, k, v, causal=True, out=out, return_lse=True, backend=path)
    torch.cuda.synchronize()
    check_against_reference(out, lse, q, k, v, True, 1 / math.sqrt(d), dname)


@pytest.mark.parametrize("d", [1, 32, 80, 96, 256])
@pytest.mark.parametrize("dname", ["fp16", "bf16", "fp32"])
def test_naive_any_head_dim(d, dname):
    run_case("naive", dname, d, True, 2, 97, 130)


@pytest.mark.parametrize("d", [32, 96, 256])
@pytest.mark.parametrize("path", ["simt", "wmma", "mma", "wgmma"])
def test_flash_paths_refuse_other_head_dims(path, d):
    q, k, v = random_qkv(1, 8, 8, 2, 2, d, torch.float16)
    with pytest.raises(ValueError, match=rf"backend '{path}' supports head_dim 64 and 128; got {d}"):
        waveboost.attention(q, k, v, backend=path)


@pytest.mark.parametrize("path", HALF_ONLY_PATHS)
def test_half_only_paths_refuse_fp32(path):
    q, k, v = random_qkv(1, 8, 8, 2, 2, 64, torch.float32)
    with pytest.raises(ValueError, match=rf"backend '{path}' supports float16 and bfloat16; got float32"):
        waveboost.attention(q, k, v, backend=path)


@pytest.mark.parametrize(
    "dname,d,b,h,lq,lk,expected",
    [("fp16", 64, 16, 64, 128, 128, "mma"),  # 1024 blocks of 128 query rows: more than one per SM, one key tile
     ("fp16", 64, 8, 64, 256, 256, "wgmma"),  # from 256 keys wgmma leads (blocks of 64 rows, two per SM)
     ("fp16", 64, 8, 64, 512, 512, "wgmma"),
     ("fp16", 64, 1, 2, 100, 100, "wgmma"),  # 2 blocks: a fraction of one wave
     ("fp16", 64, 1, 2, 8, 8, "decode"),  # 8 query rows per kv head: packed into one decode tile
     ("fp16", 64, 8, 64, 128, 4096, "wgmma"), ("bf16", 128, 8, 64, 512, 512, "wgmma"),
     ("fp32", 128, 1, 2, 8, 8, "mma"), ("fp16", 80, 1, 2, 8, 8, "naive")],
)
def test_auto_rule(dname, d, b, h, lq, lk, expected):
    if expected == "wgmma" and torch.cuda.get_device_capability() != (9, 0):
        expected = "mma"  # wgmma runs on compute capability 9.0 only
    q, k, v = random_qkv(b, lq, lk, h, 2, d, DTYPES[dname])
    assert waveboost.resolve_backend(q, k, v) == expected
    out = waveboost.attention(q, k, v)
    torch.testing.assert_close(out, waveboost.attention(q, k, v, backend=expected), rtol=0, atol=0)


@pytest.mark.parametrize("path", CUDA_PATHS)
def test_bhsd_storage_as_transposed_views(path):
    b, h, hkv, lq, lk, d = 2, 8, 2, 300, 520, 128
    qs = torch.randn(b, h, lq, d, device="cuda", dtype=torch.float16)
    ks = torch.randn(b, hkv, lk, d, device="cuda", dtype=torch.float16)
    vs = torch.randn(b, hkv, lk, d, device="cuda", dtype=torch.float16)
    q, k, v = qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2)
    out_storage = torch.full_like(qs, float("nan"))
    out = out_storage.transpose(1, 2)
    waveboost.attention(q, k, v, causal=True, out=out, backend=path)
    ref, _ = reference(q, k, v, True, 1 / math.sqrt(d))
    naive, _ = reference(q, k, v, True, 1 / math.sqrt(d), dtype=torch.float16)
    assert not torch.isnan(out_storage).any()
    assert (out.double() - ref).abs().max() <= 2 * (naive.double() - ref).abs().max() + ATOL["fp16"]


@pytest.mark.parametrize("path", CUDA_PATHS)
def test_unaligned_and_odd_strides(path):
    # A sliced view whose data pointer is not 16-byte aligned and whose row stride is odd.
    d, lq, lk = 64, 77, 131
    base_q = torch.randn(1, lq, 2, d + 1, device="cuda", dtype=torch.float16)
    base_k = torch.randn(1, lk, 2, d + 1, device="cuda", dtype=torch.float16)
    base_v = torch.randn(1, lk, 2, d + 1, device="cuda", dtype=torch.float16)
    q, k, v = base_q[..., 1:], base_k[..., 1:], base_v[..., 1:]
    out = torch.full((1, lq, 2, d), float("nan"), device="cuda", dtype=torch.float16)
    if path in ("mma", "wgmma"):  # cp.async-only paths: refuse clearly, and "auto" falls back
        with pytest.raises(ValueError, match=rf"backend '{path}' needs 16-byte aligned"):
            waveboost.attention(q, k, v, causal=True, out=out, backend=path)
        path = waveboost.resolve_backend(q, k, v, causal=True)
        assert path == "wmma"
    poison_allocator(lq * 2 * 4)
    waveboost.attention(q, k, v, causal=True, out=out, backend=path)
    _, lse = waveboost.attention(q, k, v, causal=True, return_lse=True, backend=path)
    check_against_reference(out, lse, q, k, v, True, 1 / math.sqrt(d), "fp16")


@pytest.mark.parametrize("path", CUDA_PATHS)
def test_non_default_stream_matches_default(path):
    q, k, v = random_qkv(2, 513, 700, 8, 2, 128, torch.bfloat16)
    expected = waveboost.attention(q, k, v, causal=True, backend=path)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = waveboost.attention(q, k, v, causal=True, backend=path)
    s.synchronize()
    assert torch.equal(got, expected)


@pytest.mark.parametrize("path", CUDA_PATHS)
def test_deterministic(path):
    q, k, v = random_qkv(2, 1000, 1000, 8, 8, 64, torch.float16)
    first = waveboost.attention(q, k, v, causal=True, backend=path)
    for _ in range(2):
        assert torch.equal(waveboost.attention(q, k, v, causal=True, backend=path), first)


@pytest.mark.parametrize("lq,lk", [(0, 9), (9, 0), (40, 3)])
@pytest.mark.parametrize("path", CUDA_PATHS)
def test_empty_and_fully_masked(path, lq, lk):
    q, k, v = random_qkv(2, lq, lk, 4, 2, 64, torch.float16)
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True, backend=path)
    torch.cuda.synchronize()
    ref, ref_lse = reference(q, k, v, True, 1 / 8)
    assert not torch.isnan(out).any() and torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    dead = torch.isneginf(ref_lse).transpose(1, 2)  # (B, Lq, H)
    assert torch.all(out[dead] == 0)


def test_mixed_devices_rejected():
    q, k, v = random_qkv(1, 8, 8, 2, 2, 64, torch.float32)
    with pytest.raises(ValueError, match=r"k is on cpu but q is on cuda:0"):
        waveboost.attention(q, k.cpu(), v)


@pytest.mark.parametrize("backend", ["auto", "naive"])
def test_cupy_inputs_on_current_stream(backend):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(0)
    q, k, v = (cupy.asarray(rng.standard_normal(s).astype(np.float16)) for s in
               [(2, 200, 8, 64), (2, 300, 2, 64), (2, 300, 2, 64)])
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True, backend=backend)
    stream.synchronize()
    assert isinstance(out, cupy.ndarray) and out.dtype == cupy.float16
    tq, tk, tv = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
    check_against_reference(torch.as_tensor(out, device="cuda"), torch.as_tensor(lse, device="cuda"),
                            tq, tk, tv, True, 1 / 8, "fp16")


def test_jax_eager_inputs():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX sees no GPU")
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(2, 150, 4, 128), (2, 90, 2, 128), (2, 90, 2, 128)]]
    q, k, v = (jax.device_put(jnp.asarray(a, dtype=jnp.bfloat16), gpus[0]) for a in arrays)
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(out, jax.Array) and out.dtype == jnp.bfloat16
    tq, tk, tv = (torch_from_jax(x) for x in (q, k, v))
    check_against_reference(torch.from_dlpack(out), torch.from_dlpack(lse), tq, tk, tv, True,
                            1 / math.sqrt(128), "bf16")
    # The output is an ordinary JAX array: JAX computations on it see the written values.
    np.testing.assert_allclose(float(jnp.sum(out.astype(jnp.float32))),
                               float(torch.from_dlpack(out).float().sum()), rtol=1e-5)
