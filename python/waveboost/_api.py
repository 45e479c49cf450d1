"""The public Python API: framework detection, output allocation, streams.

Kernels never see a framework: each adapter below allocates `out` (and `lse`)
with the caller's own framework, finds the stream the caller is working on,
and hands DLPack-capable tensors to the compiled module.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Optional

import numpy as np  # the one runtime dependency

from . import _waveboost

BACKENDS = ("auto", "cpu", "naive", "simt", "wmma", "mma", "wgmma")


class _Adapter(NamedTuple):
    """How to allocate and find the stream for one framework's arrays."""

    name: str
    empty: Callable[[Any, tuple, str], Any]  # (like, shape, "like" | "float32") -> new array on like's device
    stream: Callable[[Any], int]  # array -> cudaStream_t as int (0 on the CPU)
    prepare: Callable[[Any, str], Any]  # (array, argument name) -> what nanobind receives
    finish: Callable[[Any, int], None]  # (out array, stream) -> make the result safe to hand back


def _noop_finish(out: Any, stream: int) -> None:
    return None


def _identity(x: Any, arg: str) -> Any:
    return x


def _numpy_adapter() -> _Adapter:
    import numpy as np

    def empty(like, shape, dtype):
        return np.empty(shape, dtype=like.dtype if dtype == "like" else np.float32)

    return _Adapter("numpy", empty, lambda x: 0, _check_numpy_array, _noop_finish)


def _torch_adapter() -> _Adapter:
    import torch

    def empty(like, shape, dtype):
        return torch.empty(shape, dtype=like.dtype if dtype == "like" else torch.float32, device=like.device)

    # The raw-stream query is the cheap form of current_stream(device).cuda_stream (about 0.3 us
    # against 2-3 us), which counts in launch-bound calls; builds without it use the public API.
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def stream(x):
        if not x.is_cuda:
            return 0
        if raw_stream is not None:
            return raw_stream(x.device.index)
        return torch.cuda.current_stream(x.device).cuda_stream

    to_dlpack = torch.utils.dlpack.to_dlpack

    def prepare(x, arg):
        # A capsule straight from torch's exporter, not Tensor.__dlpack__: the latter is Python
        # code costing ~3.5 us per tensor (most of a launch-bound call's host time), refuses
        # tensors off the current device, and on CUDA records an event on the current stream for
        # the default stream to wait on. The kernel runs on the current stream: no wait is needed.
        if x.layout is not torch.strided:
            raise ValueError(f"{arg} must be a dense (strided) tensor; got layout {x.layout}")
        if x.requires_grad:  # forward only: no gradient flows through this call
            x = x.detach()
        if x.is_neg():  # a lazily negated view: the exporter would hand over the un-negated data
            if arg == "out":
                raise ValueError("out must be a plain tensor; got a lazily negated view (torch._neg_view)")
            x = x.resolve_neg()
        return to_dlpack(x)

    return _Adapter("torch", empty, stream, prepare, _noop_finish)


def _cupy_adapter() -> _Adapter:
    import cupy

    def empty(like, shape, dtype):
        with like.device:
            return cupy.empty(shape, dtype=like.dtype if dtype == "like" else cupy.float32)

    def stream(x):
        with x.device:
            return cupy.cuda.get_current_stream().ptr

    return _Adapter("cupy", empty, stream, _identity, _noop_finish)


def _jax_adapter() -> _Adapter:
    # The fallback for JAX (builds without the XLA FFI handlers, or out= given):
    # eager only, through DLPack. Inputs are made ready, the kernel runs on the
    # legacy default stream, and that stream is synchronized before the output
    # buffer is handed back to XLA (which knows nothing of our stream).
    import jax.numpy as jnp

    def empty(like, shape, dtype):
        return jnp.empty(shape, dtype=like.dtype if dtype == "like" else jnp.float32, device=like.device)

    def prepare(x, arg):
        return x.block_until_ready()

    def finish(out, stream):
        device_type, device_id = out.__dlpack_device__()
        if int(device_type) == 2:  # kDLCUDA
            _waveboost.stream_synchronize(int(device_id), stream)

    return _Adapter("jax", empty, lambda x: 0, prepare, finish)


def _check_numpy_array(x: Any, arg: str) -> Any:
    """NumPy arrays whose meaning DLPack cannot carry are refused rather than misread."""
    if type(x) is np.ndarray and x.dtype.isnative:  # the common case, first and cheap
        return x
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{arg} is a NumPy masked array, whose mask waveboost would ignore; pass "
                        f"np.asarray({arg}) (mask dropped) or {arg}.filled(value) if that is what you mean")
    if not x.dtype.isnative:
        raise TypeError(f"{arg} has non-native byte order (dtype '{x.dtype.str}'); pass "
                        f"{arg}.astype({arg}.dtype.newbyteorder('=')) instead")
    return x


def _dlpack_adapter() -> _Adapter:
    # Any other object speaking DLPack (__dlpack__ and __dlpack_device__). Such inputs are read
    # as zero-copy NumPy views (_host_view) before any adapter work, so this one only marks them.
    def unreachable(*args):
        raise AssertionError("generic DLPack producers are converted to NumPy views first")

    return _Adapter("dlpack", unreachable, unreachable, unreachable, unreachable)


def _host_view(x: Any, arg: str) -> Any:
    """A generic DLPack producer in host memory as a zero-copy NumPy view; other arrays unchanged."""
    if x is None or _adapter_for(x, arg).name != "dlpack":
        return x
    device_type, device_id = x.__dlpack_device__()
    if int(device_type) != 1:  # kDLCPU
        raise TypeError(
            f"{arg} is a {type(x).__module__}.{type(x).__qualname__} on DLPack device ({int(device_type)}, "
            f"{int(device_id)}): waveboost takes NumPy, PyTorch, CuPy and JAX arrays anywhere, and other DLPack "
            "producers only in host memory (read as NumPy views; results are NumPy arrays)")
    try:
        return np.from_dlpack(x)
    except (BufferError, TypeError, ValueError) as e:
        raise TypeError(f"{arg} cannot be read through DLPack as a NumPy view: {e}") from None


_ADAPTER_FACTORIES = {"numpy": _numpy_adapter, "torch": _torch_adapter, "cupy": _cupy_adapter,
                      "jax": _jax_adapter, "jaxlib": _jax_adapter}
_adapters: dict = {}  # array type -> _Adapter, built on first use (imports the framework once)


def _adapter_for(x: Any, arg: str) -> _Adapter:
    adapter = _adapters.get(type(x))
    if adapter is not None:
        return adapter
    factory = _ADAPTER_FACTORIES.get(type(x).__module__.split(".")[0])
    if factory is not None:
        adapter = _adapters[type(x)] = factory()
        return adapter
    if hasattr(type(x), "__dlpack__") and hasattr(type(x), "__dlpack_device__"):
        adapter = _adapters[type(x)] = _dlpack_adapter()
        return adapter
    raise TypeError(
        f"{arg} must be a NumPy, PyTorch, CuPy or JAX array, or an object with __dlpack__ and __dlpack_device__; "
        f"got {type(x).__module__}.{type(x).__qualname__}"
    )


def _raise_not_dlpack(named: Any) -> None:
    """Names the tensor the compiled module could not import, with its exporter's reason."""
    for name, x in named:
        export = getattr(x, "__dlpack__", None)
        if export is None:
            continue
        try:
            export()
        except Exception as e:  # the exporter's own reason, e.g. an unsupported dtype
            dtype = getattr(x, "dtype", None)
            raise TypeError(f"{name} (dtype {dtype}) cannot be passed through DLPack ({e}); waveboost takes "
                            "float16, bfloat16, float32 and float64 arrays") from None


def check_flag(value: Any, arg: str) -> bool:
    """A Python or NumPy bool as a bool; anything else (a string, an int, None) is a TypeError."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    raise TypeError(f"{arg} must be a bool; got {type(value).__name__} {value!r}")


def check_softmax_scale(softmax_scale: Any) -> Optional[float]:
    """None, or a finite real number as a float (a bool, a string or inf is an error)."""
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, (bool, str, bytes)) or not hasattr(softmax_scale, "__float__"):
        raise TypeError(f"softmax_scale must be a float or None; got {type(softmax_scale).__name__}")
    softmax_scale = float(softmax_scale)
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be a finite number; got {softmax_scale}")
    return softmax_scale


def check_backend(backend: Any) -> str:
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, one of {BACKENDS}; got {type(backend).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    return backend


def _check_shape(x: Any, arg: str) -> tuple:
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) != 4:
        raise ValueError(f"{arg} must be a 4-D tensor (batch, seqlen, heads, head_dim); got shape {shape}")
    return shape


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    out: Any = None,
    return_lse: bool = False,
    backend: str = "auto",
) -> Any:
    """Exact scaled dot-product attention, forward.

    Args:
        q: (batch, seqlen_q, heads, head_dim). Any strides with a unit last stride, so a
            (batch, heads, seqlen, head_dim) PyTorch tensor is passed as ``x.transpose(1, 2)``.
        k, v: (batch, seqlen_k, heads_kv, head_dim); ``heads % heads_kv == 0`` (GQA/MQA): query
            head ``h`` reads kv head ``h // (heads // heads_kv)``.
        causal: mask aligned bottom-right: query ``i`` sees keys ``j <= i + seqlen_k - seqlen_q``.
            A query that sees no key outputs zeros (and LSE ``-inf``).
        softmax_scale: multiplies ``q @ k^T``; defaults to ``1 / sqrt(head_dim)``.
        out: optional preallocated output (same framework, device, dtype and shape as ``q``).
        return_lse: also return the float32 (batch, heads, seqlen_q) natural-log logsumexp of
            the scaled scores.
        backend: "auto", "cpu", "naive", "simt", "wmma", "mma" or "wgmma" (see the README's backends table).

    Returns:
        ``out``, or ``(out, lse)`` when ``return_lse`` is true; arrays of ``q``'s framework.
    """
    check_backend(backend)
    causal = check_flag(causal, "causal")
    return_lse = check_flag(return_lse, "return_lse")
    if not (type(k) is type(q) and type(v) is type(q) and (out is None or type(out) is type(q))) or \
            _adapter_for(q, "q").name == "dlpack":  # the common case (one array type, a known one) skips this
        q, k, v, out = (_host_view(t, name) for name, t in (("q", q), ("k", k), ("v", v), ("out", out)))
    softmax_scale = check_softmax_scale(softmax_scale)
    adapter = _adapter_for(q, "q")
    for name, t in (("k", k), ("v", v)) + ((("out", out),) if out is not None else ()):
        other = _adapter_for(t, name)
        if other.name != adapter.name:
            raise TypeError(f"{name} is a {other.name} array but q is a {adapter.name} array; use one framework")
    if backend in ("auto", "cpu") and _is_host_half(adapter, q, k, v, out):
        return _attention_host_half(adapter, q, k, v, causal, softmax_scale, out, return_lse)
    if adapter.name == "jax":
        from . import jax as waveboost_jax

        if out is None and waveboost_jax.ffi_available():
            # XLA's own route: outputs from XLA, kernel on XLA's stream, no sync; works under jit too.
            return waveboost_jax.attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                           return_lse=return_lse, backend=backend)
        waveboost_jax._check_dlpack_fallback((q, k, v, out), out is not None)
    shape = _check_shape(q, "q")
    if out is not None and getattr(getattr(out, "flags", None), "writeable", True) is False:
        raise ValueError("out must be writeable; got a read-only array")
    if out is None:
        out = adapter.empty(q, shape, "like")
    lse = adapter.empty(q, (shape[0], shape[2], shape[1]), "float32") if return_lse else None
    stream = adapter.stream(q)
    prep = adapter.prepare
    args = (prep(q, "q"), prep(k, "k"), prep(v, "v"), prep(out, "out"), None if lse is None else prep(lse, "lse"))
    try:
        _waveboost.forward(*args, causal, softmax_scale, backend, stream)
    except TypeError as e:
        if "incompatible function arguments" not in str(e):
            raise
        _raise_not_dlpack(zip(("q", "k", "v", "out", "lse"), args))
        raise
    adapter.finish(out, stream)
    return (out, lse) if return_lse else out


def resolve_backend(q: Any, k: Any, v: Any, *, causal: bool = False, backend: str = "auto") -> str:
    """The backend ``attention`` would run for these tensors; ValueError says why if none can."""
    check_backend(backend)
    causal = check_flag(causal, "causal")
    q, k, v = (_host_view(t, name) for name, t in (("q", q), ("k", k), ("v", v)))
    adapter = _adapter_for(q, "q")
    for name, t in (("k", k), ("v", v)):
        other = _adapter_for(t, name)
        if other.name != adapter.name:
            raise TypeError(f"{name} is a {other.name} array but q is a {adapter.name} array; use one framework")
    prep = adapter.prepare
    args = (prep(q, "q"), prep(k, "k"), prep(v, "v"))
    try:
        return _waveboost.resolve_backend(*args, causal, backend)
    except TypeError as e:
        if "incompatible function arguments" not in str(e):
            raise
        _raise_not_dlpack(zip(("q", "k", "v"), args))
        raise


def info() -> dict:
    """Version, CUDA build facts, the GPUs seen, the backends this machine can run (on GPU 0), and the
    CPU path's instruction set ("avx512", "avx2" or "baseline") and thread count."""
    gpus = [_waveboost.cuda_device_description(i) for i in range(_waveboost.cuda_device_count())]
    backends = ["cpu"]
    if gpus:
        backends += [b for b in BACKENDS[2:] if _waveboost.backend_available(b, 0)]
    return {
        "version": _waveboost.version(),
        "cuda_compiled": bool(_waveboost.cuda_compiled()),
        "cuda_architectures": _waveboost.cuda_architectures(),
        "gpus": gpus,
        "gpu": gpus[0] if gpus else None,
        "backends": backends,
        "cpu_isa": _waveboost.cpu_isa(),
        "cpu_threads": _waveboost.cpu_num_threads(),
    }


# ---------------------------------------------------------------------------------------------
# Half precision on the CPU: computed in float32, as torch's CPU SDPA does
# ---------------------------------------------------------------------------------------------


def _is_host_half(adapter: _Adapter, q: Any, k: Any, v: Any, out: Any) -> bool:
    """fp16/bf16 host arrays (NumPy, PyTorch, eager JAX), all of one dtype (mismatches go on to the usual error)."""
    if adapter.name == "torch":
        if q.dtype not in _torch_half_dtypes() or not q.is_cpu:
            return False
    elif adapter.name == "numpy":
        if q.dtype.itemsize != 2 or q.dtype.name not in ("float16", "bfloat16"):  # bfloat16: ml_dtypes' NumPy dtype
            return False
    elif adapter.name == "jax":
        # Concrete host arrays only: under jit the platform is XLA's to choose, and out= is the DLPack route.
        import jax

        if (q.dtype.itemsize != 2 or q.dtype.name not in ("float16", "bfloat16") or out is not None
                or any(isinstance(t, jax.core.Tracer) for t in (q, k, v))
                or any(d.platform != "cpu" for t in (q, k, v) for d in t.devices())):
            return False
    else:
        return False
    return all(t is None or (type(t) is type(q) and t.dtype == q.dtype) for t in (k, v, out))


@functools.lru_cache(maxsize=None)
def _torch_half_dtypes() -> tuple:
    import torch

    return (torch.float16, torch.bfloat16)


def _attention_host_half(adapter: _Adapter, q: Any, k: Any, v: Any, causal: bool, softmax_scale: Optional[float],
                         out: Any, return_lse: bool) -> Any:
    def upcast(x: Any) -> Any:
        if adapter.name == "torch":
            return x.float()
        if adapter.name == "jax":
            return x.astype(np.float32)
        return _check_numpy_array(x, "q").astype(np.float32)

    if out is not None and tuple(out.shape) != tuple(q.shape):
        raise ValueError(f"out has shape {tuple(out.shape)} but q has {tuple(q.shape)}; they must match")
    if adapter.name == "numpy":
        for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
            if t is not None:
                _check_numpy_array(t, name)
    res, lse = attention(upcast(q), upcast(k), upcast(v), causal=causal, softmax_scale=softmax_scale,
                         return_lse=True, backend="cpu")
    if out is None:
        out = res.to(q.dtype) if adapter.name == "torch" else res.astype(q.dtype)  # NumPy, JAX: astype
    elif adapter.name == "torch":
        out.copy_(res)
    else:
        out[...] = res
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# flash-attn's calling convention (drop-in for flash_attn.flash_attn_func, forward only)
# ---------------------------------------------------------------------------------------------


def _lse_no_key_to_inf(lse: Any) -> Any:
    """flash-attn reports +inf as the LSE of a row that sees no key; waveboost reports -inf."""
    if type(lse).__module__.split(".")[0] in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return jnp.where(lse == -jnp.inf, jnp.inf, lse)
    lse[lse == -math.inf] = math.inf  # NumPy, PyTorch and CuPy arrays, in place
    return lse


def flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """``flash_attn.flash_attn_func``'s names, argument order and results, on waveboost's kernels.

    Layout (batch, seqlen, heads, head_dim), as flash-attn and ``waveboost.attention``; GQA/MQA by
    ``heads % heads_kv == 0``; ``causal`` aligned bottom-right (flash-attn >= 2.1). Returns ``out``,
    or ``(out, softmax_lse, None)`` when ``return_attn_probs`` is true: ``softmax_lse`` is float32
    (batch, heads, seqlen_q) and, as in flash-attn, ``+inf`` for a query row that sees no key (such
    a row's output is zeros); ``waveboost.attention`` reports ``-inf`` there. The third element is
    flash-attn's dropout mask, which exists only with dropout.

    Refused with ValueError (not silently ignored): ``dropout_p`` > 0, a ``window_size`` other than
    (-1, -1), ``softcap`` != 0 and ``alibi_slopes``. ``deterministic`` is accepted: the forward pass
    is deterministic anyway.
    """
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float; got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0: waveboost has no dropout (inference only); got {dropout_p}")
    try:
        window = tuple(int(w) for w in window_size)
    except TypeError:
        raise TypeError(f"window_size must be a pair of ints; got {window_size!r}") from None
    if window != (-1, -1):
        raise ValueError(f"window_size must be (-1, -1): sliding-window attention is not supported; "
                         f"got {window_size!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float; got {type(softcap).__name__}")
    if softcap != 0.0:
        raise ValueError(f"softcap must be 0.0: score soft-capping is not supported; got {softcap}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes must be None: ALiBi is not supported")
    check_flag(deterministic, "deterministic")
    if not check_flag(return_attn_probs, "return_attn_probs"):
        return attention(q, k, v, causal=causal, softmax_scale=softmax_scale)
    out, lse = attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True)
    return out, _lse_no_key_to_inf(lse), None
