"""Property-based tests (hypothesis): random shapes, GQA ratios, layouts, dtypes, causal flags and scales
against the float64 reference.

Layouts are views the API must accept and honour: contiguous, BHSD storage seen through a transpose,
a slice of a wider last dimension (data pointer not 16-byte aligned, odd strides), every other row,
a slice of heads, reversed rows (NumPy only: negative strides) and, for inputs, a batch broadcast with
stride 0. `out` gets its own layout, inside a NaN-poisoned buffer: every element of the view must be
written and nothing outside it.

Correctness: every output element within 2x tests/reference.py:rounding_error_bound (the worst-case
first-order rounding bound of a correct kernel in the call's precision); LSE within the same analysis;
rows that see no key are zeros with LSE -inf.

CPU cases run in CI (bounded: MAX_EXAMPLES_CPU examples, small shapes). GPU cases (marked gpu) cover
every CUDA path with each dtype it supports; where a path must refuse a layout (mma and wgmma need
16-byte aligned data and strides that are multiples of 16 bytes: 8 elements of fp16/bf16, 4 of fp32)
the property is that it refuses exactly then, with the documented ValueError, and that "auto" falls
back to a path that takes it (wmma for fp16/bf16, simt for fp32).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import waveboost
from reference import attention_ref, attention_ref_torch, rounding_error_bound

DEV = "cuda"
MAX_EXAMPLES_CPU = 400
MAX_EXAMPLES_GPU = 40
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24, "fp64": 2.0**-53}

LAYOUTS = ["contiguous", "bhsd", "padded", "every_other_row", "heads_slice", "reversed_rows", "broadcast_batch"]
OUT_LAYOUTS = ["contiguous", "bhsd", "padded", "every_other_row", "heads_slice", "reversed_rows"]


def make_view(xp, shape, layout, fill, pad_offset=1):
    """A (B, L, H, D) view of `layout` over a fresh buffer filled by fill(buffer_shape).

    xp is a small namespace: np-like with `.transpose(x, axes)`. Returns (view, buffer).
    """
    b, l, h, d = shape
    if layout == "contiguous":
        buf = fill((b, l, h, d))
        return buf, buf
    if layout == "bhsd":
        buf = fill((b, h, l, d))
        return xp.transpose(buf, (0, 2, 1, 3)), buf
    if layout == "padded":
        buf = fill((b, l, h, d + 1 + pad_offset))
        return buf[..., pad_offset : pad_offset + d], buf
    if layout == "every_other_row":
        buf = fill((b, 2 * l, h, d))
        return buf[:, ::2], buf
    if layout == "heads_slice":
        buf = fill((b, l, h + 2, d))
        return buf[:, :, 1 : h + 1], buf
    if layout == "reversed_rows":
        buf = fill((b, l, h, d))
        return xp.flip_rows(buf), buf
    if layout == "broadcast_batch":
        buf = fill((1, l, h, d))
        return xp.broadcast(buf, (b, l, h, d)), buf
    raise AssertionError(layout)


class _NumpyOps:
    transpose = staticmethod(np.transpose)

    @staticmethod
    def flip_rows(x):
        return x[:, ::-1]

    @staticmethod
    def broadcast(x, shape):
        return np.broadcast_to(x, shape)


@st.composite
def problems(draw, head_dims, max_len, layouts, out_layouts, max_batch=3):
    batch = draw(st.integers(1, max_batch))
    seqlen_q = draw(st.one_of(st.integers(1, max_len), st.sampled_from([0, 1, 7])))
    seqlen_k = draw(st.one_of(st.integers(1, max_len), st.sampled_from([0, 1, 7])))
    heads_kv = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 3, 4, 8]))
    return dict(
        shape=(batch, seqlen_q, seqlen_k, heads_kv * group, heads_kv, draw(st.sampled_from(head_dims))),
        causal=draw(st.booleans()),
        scale=draw(st.one_of(st.none(), st.floats(-2.0, 2.0, allow_nan=False), st.sampled_from([0.0, -0.125]))),
        layouts=[draw(st.sampled_from(layouts)) for _ in range(3)],
        out_layout=draw(st.sampled_from(out_layouts)),
        pad_offset=draw(st.integers(1, 3)),
        seed=draw(st.integers(0, 2**32 - 1)),
        return_lse=draw(st.booleans()),
    )


def _check(out, lse, ref, ref_lse, bound, score_scale, u_acc):
    """out/ref (B, Lq, H, D), lse/ref_lse (B, H, Lq) as float64 NumPy arrays."""
    assert not np.isnan(out).any(), "unwritten (NaN-poisoned) or NaN output elements"
    excess = np.max(np.abs(out - ref) - 2 * bound) if out.size else 0.0
    assert excess <= 0, f"error exceeds 2x the rounding bound by {excess:.3g}"
    if lse is not None:
        assert lse.shape == ref_lse.shape and not np.isnan(lse).any()
        assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "rows with no visible key need LSE -inf"
        dead = np.isneginf(ref_lse).transpose(0, 2, 1)  # (B, Lq, H)
        assert np.all(out[dead] == 0), "rows with no visible key must be exactly 0"
        fin = np.isfinite(ref_lse)
        if fin.any():
            d = out.shape[-1]
            tol = 1e-5 * (1 + np.abs(ref_lse[fin])) + 2 * (d + 4) * u_acc * score_scale[fin]
            assert np.all(np.abs(lse[fin] - ref_lse[fin]) <= tol)


# ---------------------------------------------------------------------------------------------
# CPU (in CI)
# ---------------------------------------------------------------------------------------------


@settings(max_examples=MAX_EXAMPLES_CPU, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          print_blob=True)
@given(problem=problems(head_dims=[1, 3, 16, 33, 64, 80, 128], max_len=70, layouts=LAYOUTS,
                        out_layouts=OUT_LAYOUTS),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_cpu_matches_reference(problem, dtype):
    b, lq, lk, h, hkv, d = problem["shape"]
    rng = np.random.default_rng(problem["seed"])
    fill = lambda s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    off = problem["pad_offset"]
    q, _ = make_view(_NumpyOps, (b, lq, h, d), problem["layouts"][0], fill, off)
    k, _ = make_view(_NumpyOps, (b, lk, hkv, d), problem["layouts"][1], fill, off)
    v, _ = make_view(_NumpyOps, (b, lk, hkv, d), problem["layouts"][2], fill, off)
    out, out_buf = make_view(_NumpyOps, (b, lq, h, d), problem["out_layout"],
                             lambda s: np.full(s, np.nan, dtype), off)
    result = waveboost.attention(q, k, v, causal=problem["causal"], softmax_scale=problem["scale"], out=out,
                                 return_lse=problem["return_lse"], backend="cpu")
    res, lse = result if problem["return_lse"] else (result, None)
    assert res is out
    ref, ref_lse = attention_ref(q, k, v, causal=problem["causal"], softmax_scale=problem["scale"])
    u = UNIT_ROUNDOFF["fp32" if dtype == np.float32 else "fp64"]
    bound, score_scale = rounding_error_bound(q, k, v, problem["causal"], problem["scale"], u, u,
                                              return_score_scale=True)
    _check(out.astype(np.float64), None if lse is None else lse.astype(np.float64), ref, ref_lse, bound,
           score_scale, u)
    # Nothing outside the view was written: the buffer's other elements are still NaN.
    assert np.isnan(out_buf).sum() == out_buf.size - out.size


# ---------------------------------------------------------------------------------------------
# GPU (through PyTorch)
# ---------------------------------------------------------------------------------------------

PATH_DTYPES = {"naive": ["fp16", "bf16", "fp32"], "simt": ["fp16", "bf16", "fp32"], "wmma": ["fp16", "bf16"],
               "mma": ["fp16", "bf16", "fp32"], "wgmma": ["fp16", "bf16"]}
PATH_HEAD_DIMS = {"naive": [1, 24, 64, 80, 128, 256], "simt": [64, 128], "wmma": [64, 128], "mma": [64, 128],
                  "wgmma": [64, 128]}
# Paths that move tiles in 16-byte pieces and refuse layouts that do not allow it.
VECTOR_PATHS = ("mma", "wgmma")
GPU_LAYOUTS = [x for x in LAYOUTS if x != "reversed_rows"]  # torch has no negative strides
GPU_OUT_LAYOUTS = [x for x in OUT_LAYOUTS if x != "reversed_rows"]


class _TorchOps:
    @staticmethod
    def transpose(x, axes):
        return x.permute(*axes)

    @staticmethod
    def broadcast(x, shape):
        return x.expand(*shape)


def _vector_path_can_take(tensors):
    """mma's and wgmma's documented condition: 16-byte aligned data, strides (of dims of extent > 1) multiples of
    16 bytes (8 elements of fp16/bf16, 4 of fp32)."""
    for t in tensors:
        if t.data_ptr() % 16:
            return False
        for size, stride in zip(t.shape[:-1], t.stride()[:-1]):  # head_dim: unit stride
            if size > 1 and stride * t.element_size() % 16:
                return False
    return True


@pytest.mark.gpu
@pytest.mark.parametrize("path", list(PATH_DTYPES))
def test_gpu_matches_reference(path):
    torch = pytest.importorskip("torch", reason="the GPU tests drive the kernels through PyTorch")
    if path == "wgmma" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("backend 'wgmma' needs compute capability 9.0")
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

    @settings(max_examples=MAX_EXAMPLES_GPU, deadline=None, suppress_health_check=[HealthCheck.too_slow],
              print_blob=True)
    @given(problem=problems(head_dims=PATH_HEAD_DIMS[path], max_len=300, layouts=GPU_LAYOUTS,
                            out_layouts=GPU_OUT_LAYOUTS),
           dname=st.sampled_from(PATH_DTYPES[path]))
    def check(problem, dname):
        b, lq, lk, h, hkv, d = problem["shape"]
        dtype = dtypes[dname]
        g = torch.Generator(device=DEV).manual_seed(problem["seed"])
        fill = lambda s: torch.randn(*s, generator=g, device=DEV).to(dtype)  # noqa: E731
        off = problem["pad_offset"]
        q, _ = make_view(_TorchOps, (b, lq, h, d), problem["layouts"][0], fill, off)
        k, _ = make_view(_TorchOps, (b, lk, hkv, d), problem["layouts"][1], fill, off)
        v, _ = make_view(_TorchOps, (b, lk, hkv, d), problem["layouts"][2], fill, off)
        out, out_buf = make_view(_TorchOps, (b, lq, h, d), problem["out_layout"],
                                 lambda s: torch.full(s, float("nan"), device=DEV, dtype=dtype), off)
        backend = path
        if path in VECTOR_PATHS and not _vector_path_can_take([q, k, v, out]):
            with pytest.raises(ValueError, match=rf"backend '{path}' needs 16-byte aligned"):
                waveboost.attention(q, k, v, causal=problem["causal"], softmax_scale=problem["scale"], out=out,
                                    backend=path)
            if not _vector_path_can_take([q, k, v]):
                fallback = "simt" if dname == "fp32" else "wmma"
                assert waveboost.resolve_backend(q, k, v, causal=problem["causal"]) == fallback
            backend = "auto"  # must fall back to a path that takes this layout
        result = waveboost.attention(q, k, v, causal=problem["causal"], softmax_scale=problem["scale"], out=out,
                                     return_lse=problem["return_lse"], backend=backend)
        torch.cuda.synchronize()
        res, lse = result if problem["return_lse"] else (result, None)
        assert res is out
        scale = problem["scale"] if problem["scale"] is not None else 1 / math.sqrt(d)
        ref, ref_lse = attention_ref_torch(q, k, v, problem["causal"], scale)
        bound, score_scale = rounding_error_bound(q, k, v, problem["causal"], scale, 2.0**-24,
                                                  UNIT_ROUNDOFF[dname], return_score_scale=True)
        _check(out.double().cpu().numpy(), None if lse is None else lse.double().cpu().numpy(),
               ref.cpu().numpy(), ref_lse.cpu().numpy(), bound.cpu().numpy(), score_scale.cpu().numpy(), 2.0**-24)
        assert torch.isnan(out_buf).sum().item() == out_buf.numel() - out.numel(), "wrote outside the out view"

    check()
