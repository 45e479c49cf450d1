"""Arguments are taken only when their meaning is certain: flags are bools, arrays carry no
information DLPack would drop, and every refusal is a ValueError/TypeError naming the argument
(never the compiled module's signature dump)."""

from __future__ import annotations

import numpy as np
import pytest
from reference import attention_ref, max_abs_err, random_qkv

import waveboost


def _no_signature_dump(excinfo):
    assert "incompatible function arguments" not in str(excinfo.value)


@pytest.mark.parametrize("value", ["no", "False", 0, 1, None, 1.0, [True]])
def test_causal_must_be_a_bool(rng, value):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16)
    with pytest.raises(TypeError, match=r"causal must be a bool; got") as e:
        waveboost.attention(q, k, v, causal=value)
    _no_signature_dump(e)
    with pytest.raises(TypeError, match=r"causal must be a bool; got"):
        waveboost.resolve_backend(q, k, v, causal=value)


def test_return_lse_must_be_a_bool(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16)
    with pytest.raises(TypeError, match=r"return_lse must be a bool; got str"):
        waveboost.attention(q, k, v, return_lse="yes")


def test_numpy_bools_are_bools(rng):
    q, k, v = random_qkv(rng, 1, 7, 9, 2, 1, 16)
    out = waveboost.attention(q, k, v, causal=np.bool_(True))
    assert max_abs_err(out, attention_ref(q, k, v, causal=True)[0]) < 1e-5
    assert waveboost.resolve_backend(q, k, v, causal=np.bool_(False)) == "cpu"


def test_torch_and_jax_entry_points_check_causal(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16)
    torch = pytest.importorskip("torch", reason="the torch entry point needs PyTorch")
    import waveboost.torch as wt

    args = [torch.from_numpy(x) for x in (q, k, v)]
    with pytest.raises(TypeError, match=r"causal must be a bool; got str"):
        wt.attention(*args, causal="no")
    with pytest.raises(TypeError, match=r"return_lse must be a bool; got int"):
        wt.attention(*args, return_lse=1)
    with pytest.raises(TypeError, match=r"softmax_scale must be a float or None; got str"):
        wt.attention(*args, softmax_scale="0.1")
    with pytest.raises(ValueError, match=r"softmax_scale must be a finite number; got inf"):
        wt.attention(*args, softmax_scale=float("inf"))
    with pytest.raises(TypeError, match=r"backend must be a str"):
        wt.attention(*args, backend=None)
    jax_numpy = pytest.importorskip("jax.numpy", reason="the JAX entry point needs jax")
    import waveboost.jax as wj

    if wj.ffi_available():
        with pytest.raises(TypeError, match=r"causal must be a bool; got str"):
            wj.attention(*(jax_numpy.asarray(x) for x in (q, k, v)), causal="no")


@pytest.mark.parametrize("backend,error", [(None, TypeError), (3, TypeError), ("flash", ValueError)])
def test_resolve_backend_checks_backend(rng, backend, error):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16)
    with pytest.raises(error, match=r"backend must be") as e:
        waveboost.resolve_backend(q, k, v, backend=backend)
    _no_signature_dump(e)


@pytest.mark.parametrize("arg", ["q", "k", "v", "out"])
def test_masked_arrays_are_refused(rng, arg):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16)
    args = dict(q=q, k=k, v=v, out=np.empty_like(q))
    args[arg] = np.ma.masked_array(args[arg], mask=np.zeros(args[arg].shape, bool))
    with pytest.raises(TypeError, match=rf"{arg} is a NumPy masked array"):
        waveboost.attention(args["q"], args["k"], args["v"], out=args["out"])


@pytest.mark.parametrize("arg", ["q", "k", "v", "out"])
def test_byte_swapped_arrays_are_refused(rng, arg):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16)
    args = dict(q=q, k=k, v=v, out=np.empty_like(q))
    args[arg] = args[arg].astype(args[arg].dtype.newbyteorder())
    with pytest.raises(TypeError, match=rf"{arg} has non-native byte order") as e:
        waveboost.attention(args["q"], args["k"], args["v"], out=args["out"])
    _no_signature_dump(e)


@pytest.mark.parametrize("dtype", ["U1", object, "datetime64[s]"])
def test_dtypes_dlpack_cannot_carry_are_named(rng, dtype):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16)
    with pytest.raises(TypeError, match=r"k \(dtype .*\) cannot be passed through DLPack") as e:
        waveboost.attention(q, k.astype(dtype), v)
    _no_signature_dump(e)
    with pytest.raises(TypeError, match=r"q \(dtype .*\) cannot be passed through DLPack"):
        waveboost.resolve_backend(q.astype(dtype), k, v)


class HostDLPack:
    """A minimal DLPack producer that is none of the frameworks waveboost knows by name."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class DeviceDLPack(HostDLPack):
    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


def test_generic_dlpack_producers_on_the_host(rng):
    q, k, v = random_qkv(rng, 2, 9, 13, 4, 2, 16)
    out, lse = waveboost.attention(HostDLPack(q), HostDLPack(k), HostDLPack(v), causal=True, return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == q.shape
    ref_out, ref_lse = attention_ref(q, k, v, causal=True)
    assert max_abs_err(out, ref_out) < 1e-5 and max_abs_err(lse, ref_lse) < 1e-5
    # Mixed with NumPy arrays, and writing into a NumPy out.
    dest = np.full_like(q, np.nan)
    waveboost.attention(q, HostDLPack(k), v, causal=True, out=dest)
    assert max_abs_err(dest, ref_out) < 1e-5
    assert waveboost.resolve_backend(HostDLPack(q), HostDLPack(k), HostDLPack(v)) == "cpu"


def test_generic_dlpack_producers_off_the_host_are_refused(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16)
    with pytest.raises(TypeError, match=r"q is a .*DeviceDLPack on DLPack device \(2, 0\).*only in host memory"):
        waveboost.attention(DeviceDLPack(q), DeviceDLPack(k), DeviceDLPack(v))


def test_objects_without_dlpack_are_refused(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16)
    with pytest.raises(TypeError, match=r"q must be a NumPy, PyTorch, CuPy or JAX array, or an object with __dlpack__"):
        waveboost.attention(q.tolist(), k, v)


@pytest.mark.parametrize(
    "strides,field",
    [((0, 8, 200, 1), "q_row_stride is 8 but head_dim is 16"), ((400, 16, 4, 1), "q_head_stride is 4 but head_dim is 16")],
)
def test_inputs_with_overlapping_rows_or_heads_are_refused(rng, strides, field):
    base = rng.standard_normal(4096).astype(np.float32)
    q = np.lib.stride_tricks.as_strided(base, (1, 9, 2, 16), tuple(s * 4 for s in strides))
    _, k, v = random_qkv(rng, 1, 9, 9, 2, 2, 16)
    with pytest.raises(ValueError, match=field):
        waveboost.attention(q, k, v)
    with pytest.raises(ValueError, match=field):
        waveboost.resolve_backend(q, k, v)


def test_broadcast_query_resolves(rng):
    _, k, v = random_qkv(rng, 1, 9, 9, 2, 2, 16)
    q = np.broadcast_to(k[:, :1], (1, 9, 2, 16))
    assert waveboost.resolve_backend(q, k, v) == "cpu"
