"""Bad input raises ValueError/TypeError whose message names the argument, never a crash."""

from __future__ import annotations

import numpy as np
import pytest

import waveboost


def qkv(b=2, lq=8, lk=8, h=4, hkv=2, d=16, dtype=np.float32):
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((b, lq, h, d)).astype(dtype),
        rng.standard_normal((b, lk, hkv, d)).astype(dtype),
        rng.standard_normal((b, lk, hkv, d)).astype(dtype),
    )


def _bad_cases():
    q, k, v = qkv()
    cases = {
        "q_ndim": (ValueError, r"q must be a 4-D", dict(q=q[0])),
        "k_ndim": (ValueError, r"k must be a 4-D", dict(k=k[0])),
        "v_ndim": (ValueError, r"v must be a 4-D", dict(v=v[..., None])),
        "batch_mismatch": (ValueError, r"k has batch 1 .* q's batch is 2", dict(k=k[:1], v=v[:1])),
        "head_dim_mismatch": (ValueError, r"k has head_dim 8 .* q's head_dim is 16", dict(k=k[..., :8])),
        "v_seqlen_mismatch": (ValueError, r"v has seqlen_k 7 .* k's seqlen_k is 8", dict(v=v[:, :7])),
        "v_heads_mismatch": (ValueError, r"v has heads_kv 1 .* k's heads_kv is 2", dict(v=v[:, :, :1])),
        "heads_not_divisible": (ValueError, r"q's heads \(4\) must be a multiple of k's heads_kv \(3\)",
                                dict(k=np.concatenate([k, k[:, :, :1]], 2), v=np.concatenate([v, v[:, :, :1]], 2))),
        "mixed_dtypes": (TypeError, r"k has dtype float64 but q has float32", dict(k=k.astype(np.float64))),
        "integer_dtype": (TypeError, r"q must have a floating-point dtype .* got int32",
                          dict(q=q.astype(np.int32), k=k.astype(np.int32), v=v.astype(np.int32))),
        "non_unit_last_stride": (ValueError, r"q must have unit stride in its last",
                                 dict(q=np.repeat(q, 2, axis=3)[..., ::2])),
        "unknown_backend": (ValueError, r"backend must be one of .* got 'flash'", dict(backend="flash")),
        "backend_not_str": (TypeError, r"backend must be a str", dict(backend=3)),
        "cuda_backend_on_cpu_data": (ValueError, r"backend 'naive' .*host memory", dict(backend="naive")),
        "wmma_backend_on_cpu_data": (ValueError, r"backend 'wmma' .*host memory", dict(backend="wmma")),
        "out_shape": (ValueError, r"out has seqlen_q 7 .* q's seqlen_q is 8", dict(out=np.empty((2, 7, 4, 16), np.float32))),
        "out_dtype": (TypeError, r"out has dtype float64 but q has float32", dict(out=np.empty(q.shape, np.float64))),
        "out_aliases_q": (ValueError, r"out overlaps the memory of q", dict(out=q)),
        "out_read_only": (ValueError, r"out must be writeable", dict(out=_read_only(np.empty_like(q)))),
        "nan_scale": (ValueError, r"softmax_scale must be a finite number; got nan", dict(softmax_scale=float("nan"))),
        "inf_scale": (ValueError, r"softmax_scale must be a finite number; got inf", dict(softmax_scale=float("inf"))),
        "str_scale": (TypeError, r"softmax_scale must be a float or None; got str", dict(softmax_scale="0.1")),
        "not_an_array": (TypeError, r"q must be a NumPy, PyTorch, CuPy or JAX array, or an object with __dlpack__ and __dlpack_device__; got builtins.list",
                         dict(q=q.tolist())),
        "mixed_frameworks": (TypeError, r"k must be a NumPy, PyTorch, CuPy or JAX array", dict(k=k.tolist())),
        "zero_kv_heads": (ValueError, r"k has 0 heads", dict(k=k[:, :, :0], v=v[:, :, :0])),
    }
    return {name: (exc, msg, {**dict(q=q, k=k, v=v), **args}) for name, (exc, msg, args) in cases.items()}


def _read_only(x):
    x.flags.writeable = False
    return x


BAD = _bad_cases()


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_clear_error(case):
    exc, pattern, args = BAD[case]
    args = dict(args)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(exc, match=pattern):
        waveboost.attention(q, k, v, **args)


def test_resolve_backend_reports_why():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="backend 'simt' runs on CUDA tensors"):
        waveboost.resolve_backend(q, k, v, backend="simt")


def test_library_usable_after_errors():
    q, k, v = qkv()
    for case in sorted(BAD):
        exc, _, args = BAD[case]
        with pytest.raises(exc):
            waveboost.attention(args["q"], args["k"], args["v"], **{n: a for n, a in args.items() if n not in "qkv"})
    assert np.isfinite(waveboost.attention(q, k, v)).all()
