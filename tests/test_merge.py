"""waveboost.merge_attention_states: attention over disjoint key sets merged through the LSE equals
attention over their union."""

from __future__ import annotations

import numpy as np
import pytest

import waveboost
from reference import attention_ref, merge_states_ref, random_qkv, rel_err


def _parts(q, k, v, bounds, causal=False):
    """Attention of q over each key range [bounds[i], bounds[i+1]) (causal alignment of the full sequence)."""
    outs, lses = [], []
    lk, lq = k.shape[1], q.shape[1]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if causal:
            # Query i sees keys j <= i + lk - lq: the chunk's mask is the full mask restricted to it.
            s_mask = (np.arange(lo, hi)[None, :] <= np.arange(lq)[:, None] + lk - lq)
            o, l = _masked_ref(q, k[:, lo:hi], v[:, lo:hi], s_mask)
        else:
            o, l = attention_ref(q, k[:, lo:hi], v[:, lo:hi])
        outs.append(o)
        lses.append(l)
    return np.stack(outs), np.stack(lses)


def _masked_ref(q, k, v, mask):
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[3])
    s = np.where(mask[None, None], s, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.max(s, axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf)
        m_safe = np.where(np.isfinite(m), m, 0)
        p = np.exp(s - m_safe)
        denom = p.sum(-1, keepdims=True)
        lse = np.where(denom[..., 0] > 0, np.log(denom[..., 0]) + m_safe[..., 0], -np.inf)
        p = np.where(denom > 0, p / np.where(denom > 0, denom, 1), 0)
    return np.einsum("bhqk,bkhd->bqhd", p, v), lse


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_merge_equals_one_shot(rng, dtype, causal):
    # Causal chunks leave early queries with no key in the late chunks: -inf LSE parts.
    b, lq, lk, h, hkv, d = 2, 37, 97, 4, 2, 64
    q, k, v = random_qkv(rng, b, lq, lk, h, hkv, d, np.float64)
    bounds = [0, 30, 31, 70, 97]
    outs, lses = _parts(q, k, v, bounds, causal)
    assert np.isneginf(lses).any() or not causal
    outs = outs.astype(dtype)
    lses = lses.astype(np.float32)
    out = np.full((b, lq, h, d), np.nan, dtype)
    res, lse = waveboost.merge_attention_states(outs, lses, out=out)
    assert res is out and lse.shape == (b, h, lq) and lse.dtype == np.float32
    one_shot, one_shot_lse = attention_ref(q, k, v, causal=causal)
    assert rel_err(out, one_shot) < (1e-5 if dtype == np.float32 else 1e-6)  # LSEs are float32
    np.testing.assert_allclose(lse, one_shot_lse, rtol=1e-6, atol=1e-6)


def test_minus_inf_parts_ignore_their_outputs(rng):
    outs = rng.standard_normal((3, 2, 5, 2, 8))
    lses = rng.standard_normal((3, 2, 2, 5)).astype(np.float32)
    lses[1] = -np.inf
    outs[1] = np.nan  # a part that saw no key may hold anything (e.g. unwritten memory)
    lses[:, 1, 0, 2] = -np.inf  # one row where every part is -inf
    out, lse = waveboost.merge_attention_states(outs, lses)
    ref, ref_lse = merge_states_ref(outs, lses)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)
    assert np.all(out[1, 2, 0] == 0) and np.isneginf(lse[1, 0, 2])


def test_sequence_and_stacked_inputs_agree(rng):
    outs = rng.standard_normal((2, 1, 7, 3, 16)).astype(np.float32)
    lses = rng.standard_normal((2, 1, 3, 7)).astype(np.float32)
    a, la = waveboost.merge_attention_states(outs, lses)
    b, lb = waveboost.merge_attention_states(list(outs), tuple(lses))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    only = waveboost.merge_attention_states(outs, lses, return_lse=False)
    np.testing.assert_array_equal(only, a)


def test_single_part_is_identity(rng):
    outs = rng.standard_normal((1, 2, 3, 2, 8)).astype(np.float32)
    lses = rng.standard_normal((1, 2, 2, 3)).astype(np.float32)
    out, lse = waveboost.merge_attention_states(outs, lses)
    np.testing.assert_allclose(out, outs[0], rtol=1e-7)
    np.testing.assert_allclose(lse, lses[0], rtol=1e-7)


@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16", "float32"])
def test_half_precision_and_mixed_dtypes_torch(rng, out_dtype):
    torch = pytest.importorskip("torch")
    outs = rng.standard_normal((3, 2, 5, 4, 32)).astype(np.float32)
    lses = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)
    ref, ref_lse = merge_states_ref(outs, lses)
    tdtype = getattr(torch, out_dtype)
    out = torch.full((2, 5, 4, 32), float("nan"), dtype=tdtype)
    res, lse = waveboost.merge_attention_states(torch.from_numpy(outs), torch.from_numpy(lses), out=out)
    assert res is out
    # One rounding of the float64 result into the output dtype.
    expected = torch.from_numpy(ref).to(tdtype)
    assert torch.equal(out, expected)
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-6)
    # Half-precision partials in, half out.
    half_parts = torch.from_numpy(outs).to(tdtype)
    merged, _ = waveboost.merge_attention_states(half_parts, torch.from_numpy(lses))
    ref_half, _ = merge_states_ref(half_parts.double().numpy(), lses)
    assert merged.dtype == tdtype and torch.equal(merged, torch.from_numpy(ref_half).to(tdtype))


def test_bad_inputs_name_the_argument(rng):
    outs = rng.standard_normal((2, 1, 3, 2, 8)).astype(np.float32)
    lses = rng.standard_normal((2, 1, 2, 3)).astype(np.float32)
    with pytest.raises(TypeError, match="lses must have dtype float32; got float64"):
        waveboost.merge_attention_states(outs, lses.astype(np.float64))
    with pytest.raises(ValueError, match="lses has num_parts 1"):
        waveboost.merge_attention_states(outs, lses[:1])
    with pytest.raises(ValueError, match="lses has seqlen 2"):
        waveboost.merge_attention_states(outs, lses[..., :2])
    with pytest.raises(ValueError, match="out has head_dim 4"):
        waveboost.merge_attention_states(outs, lses, out=np.empty((1, 3, 2, 4), np.float32))
    with pytest.raises(ValueError, match="outs must be"):
        waveboost.merge_attention_states(outs[0], lses)
    with pytest.raises(TypeError, match="outs must have a floating-point dtype"):
        waveboost.merge_attention_states(outs.astype(np.int32), lses)
    with pytest.raises(ValueError, match="at least one part"):
        waveboost.merge_attention_states([], [])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_gpu_merge(rng, dtype):
    import torch

    outs = rng.standard_normal((4, 2, 33, 8, 128)).astype(np.float32)
    lses = (rng.standard_normal((4, 2, 8, 33)) * 3).astype(np.float32)
    lses[2] = -np.inf
    outs[2] = np.nan
    lses[:, 0, 3, 5] = -np.inf
    ref, ref_lse = merge_states_ref(outs, lses)
    tdtype = getattr(torch, dtype)
    out = torch.full((2, 33, 8, 128), float("nan"), dtype=tdtype, device="cuda")
    try:
        _, lse = waveboost.merge_attention_states(torch.from_numpy(outs).cuda(), torch.from_numpy(lses).cuda(),
                                                  out=out)
    except ValueError as e:
        if "not implemented" in str(e):
            pytest.skip(f"merge_attention_states on CUDA: {e}")
        raise
    torch.cuda.synchronize()
    got = out.double().cpu().numpy()
    assert not np.isnan(got).any()
    tol = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6}[dtype]
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("num_parts,head_dim", [(17, 128), (40, 64), (130, 128), (300, 256), (70, 260), (33, 6),
                                                (20, 96), (5, 160), (3, 130), (2, 256), (8, 64), (7, 36),
                                                (12, 128)],
                         ids=["17p-d128", "40p-d64", "130p-d128", "300p-d256", "70p-d260", "33p-d6", "20p-d96",
                              "5p-d160", "3p-d130", "2p-d256", "8p-d64", "7p-d36", "12p-d128"])
def test_gpu_merge_many_parts(rng, num_parts, head_dim):
    # Past 16 parts (head dims up to 256, vector layouts) 2-8 warps share each row; up to 8 parts
    # (vector layouts, head dims up to 256) one warp loads a row's LSEs and O together (d160, d256: two
    # slices per lane, d36: 9 lanes); d260, d6, d130 (scalar accesses and a tail) and 9-16 parts
    # (12p) take the one-warp kernel that loads O after the LSEs. Rows with -inf
    # parts (NaN outputs there), a row of only -inf parts (zeros, LSE -inf) and a row with a NaN LSE
    # (NaN) in every case.
    import torch

    outs = rng.standard_normal((num_parts, 2, 5, 3, head_dim)).astype(np.float32)
    lses = (rng.standard_normal((num_parts, 2, 3, 5)) * 3).astype(np.float32)
    dead = slice(1, None, 3) if num_parts > 2 else (1, 0)  # two parts: part 1 of batch 0 only
    lses[dead] = -np.inf
    outs[dead] = np.nan
    lses[:, 1, 2, 4] = -np.inf
    lses[num_parts // 2, 0, 1, 3] = np.nan
    ref, ref_lse = merge_states_ref(outs, lses)
    ref[0, 3, 1] = np.nan  # row (b 0, seq 3, head 1) had a NaN LSE
    ref_lse[0, 1, 3] = np.nan
    parts = torch.from_numpy(outs).cuda().to(torch.float16)
    out = torch.full((2, 5, 3, head_dim), 7.0, dtype=torch.bfloat16, device="cuda")
    _, lse = waveboost.merge_attention_states(parts, torch.from_numpy(lses).cuda(), out=out)
    got = out.double().cpu().numpy()
    ref_half, _ = merge_states_ref(parts.double().cpu().numpy(), lses)
    ref_half[0, 3, 1] = np.nan
    assert np.isnan(got[0, 3, 1]).all() and np.isnan(lse[0, 1, 3].item())
    assert (got[1, 4, 2] == 0).all() and lse[1, 2, 4].item() == -np.inf
    np.testing.assert_allclose(got, ref_half, rtol=1.6e-2, atol=1.6e-2)
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, rtol=1e-5, atol=1e-5)


def test_jax_merge_under_jit(rng):
    jax = pytest.importorskip("jax")
    wbj = pytest.importorskip("waveboost.jax")
    if not wbj.merge_ffi_available():
        pytest.skip("this build of waveboost has no XLA FFI handlers (jaxlib's headers were not found)")
    outs = rng.standard_normal((3, 2, 5, 4, 16)).astype(np.float32)
    lses = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)
    lses[1] = -np.inf
    outs[1] = np.nan
    lses[:, 0, 2, 3] = -np.inf
    ref, ref_lse = merge_states_ref(outs, lses)
    with jax.default_device(jax.devices("cpu")[0]):
        jo, jl = jax.numpy.asarray(outs), jax.numpy.asarray(lses)
        out, lse = jax.jit(wbj.merge_attention_states)(jo, jl)
        np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=1e-6)
        # waveboost.merge_attention_states sends JAX arrays the same way; sequences are stacked.
        out2 = waveboost.merge_attention_states([jo[i] for i in range(3)], [jl[i] for i in range(3)],
                                                return_lse=False)
        np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))
        with pytest.raises(TypeError, match="lses must have dtype float32"):
            wbj.merge_attention_states(jo, jl.astype(jax.numpy.float16))
        with pytest.raises(ValueError, match=r"lses must have shape \(num_parts, batch, heads, seqlen\)"):
            wbj.merge_attention_states(jo, jl[:2])
