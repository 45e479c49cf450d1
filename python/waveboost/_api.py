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

# Every backend name, "auto" first, as the compiled module (the C++ API's one list) names them.
BACKENDS = tuple(_waveboost.backend_names())


class _Adapter(NamedTuple):
    """How to allocate and find the stream for one framework's arrays."""

    name: str
    empty: Callable[[Any, tuple, str], Any]  # (like, shape, "like" | a dtype name) -> new array on like's device
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
        return torch.empty(shape, dtype=like.dtype if dtype == "like" else getattr(torch, dtype), device=like.device)

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
        return jnp.empty(shape, dtype=like.dtype if dtype == "like" else getattr(jnp, dtype), device=like.device)

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


def _torch_needs_grad(tensors: tuple) -> bool:
    """Whether autograd would record an op on these torch tensors (other entries, e.g. None, are skipped)."""
    if not any(getattr(t, "requires_grad", False) for t in tensors):
        return False
    import torch

    return torch.is_grad_enabled()


def _torch_compiling() -> bool:
    """Whether torch.compile (Dynamo) is tracing the caller (torch.compiler.is_compiling from torch
    2.3; before it, torch._dynamo's, where torch has one)."""
    import torch

    is_compiling = getattr(torch.compiler, "is_compiling", None) or getattr(
        getattr(torch, "_dynamo", None), "is_compiling", None)
    return bool(is_compiling and is_compiling())


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
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
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
        backend: "auto", "cpu", "naive", "simt", "wmma", "mma", "wgmma" or "decode" (see the README's
            backends table).
        q_descale, k_descale, v_descale: FP8 only. q, k and v may be ``float8_e4m3fn`` (PyTorch, or
            JAX, under ``jit`` too), run by the ``wgmma`` backend (Hopper, head dim 128, dense
            batches; ``backend`` "wgmma" or "auto"); each holds values ``x / descale`` and is
            dequantized by its factor: a float, or a float32 array of shape (batch, heads_kv) (per
            batch and kv head) or of one element, on q's device. ``out`` is then bfloat16 (or the
            float16/bfloat16 ``out`` given). FP8 has no backward: differentiating through such a
            call (torch autograd, ``jax.grad``) raises ``NotImplementedError``.

    Returns:
        ``out``, or ``(out, lse)`` when ``return_lse`` is true; arrays of ``q``'s framework.

    PyTorch tensors that require grad (with grad mode on) go through ``waveboost.torch.attention``,
    which autograd differentiates; ``out=`` is refused there. Gradients otherwise come from
    ``attention_backward``. Inside a function ``torch.compile`` traces, calls without ``out=`` go
    through the same custom op, so ``fullgraph=True`` holds.
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
    descales = (q_descale, k_descale, v_descale)
    fp8 = check_fp8(q, backend, descales)
    if adapter.name == "torch" and (_torch_needs_grad((q, k, v) + (descales if fp8 else ()))
                                    or (out is None and _torch_compiling())):
        # Differentiable route: the waveboost::attention custom op and its autograd formula; also
        # what torch.compile traces (the DLPack route would break its graph).
        if out is not None:
            raise ValueError("out= cannot be used when q, k or v requires grad (with grad mode on): the result "
                             "must be a new tensor for autograd to differentiate; drop out=, or call under "
                             "torch.no_grad()")
        from . import torch as waveboost_torch

        return waveboost_torch.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
                                         backend=backend, q_descale=q_descale, k_descale=k_descale,
                                         v_descale=v_descale)
    if backend in ("auto", "cpu") and _is_host_half(adapter, q, k, v, out):
        return _attention_host_half(adapter, q, k, v, causal, softmax_scale, out, return_lse)
    if adapter.name == "jax":
        from . import jax as waveboost_jax

        if out is None and waveboost_jax.ffi_available():
            # XLA's own route: outputs from XLA, kernel on XLA's stream, no sync; works under jit too.
            return waveboost_jax.attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                           return_lse=return_lse, backend=backend, q_descale=q_descale,
                                           k_descale=k_descale, v_descale=v_descale)
        waveboost_jax._check_dlpack_fallback((q, k, v, out), out is not None)
    shape = _check_shape(q, "q")
    if out is not None and getattr(getattr(out, "flags", None), "writeable", True) is False:
        raise ValueError("out must be writeable; got a read-only array")
    if out is None:
        out = adapter.empty(q, shape, "bfloat16" if fp8 else "like")
    lse = adapter.empty(q, (shape[0], shape[2], shape[1]), "float32") if return_lse else None
    stream = adapter.stream(q)
    prep = adapter.prepare
    args = (prep(q, "q"), prep(k, "k"), prep(v, "v"), prep(out, "out"), None if lse is None else prep(lse, "lse"))
    if fp8:
        descales = map_descales(descales, q, k, lambda d, arg, batch, heads_kv: prep(
            _descale_array(adapter.name, d, q, batch, heads_kv, arg), arg))
    try:
        _waveboost.forward(*args, causal, softmax_scale, backend, stream, *(descales if fp8 else ()))
    except TypeError as e:
        if "incompatible function arguments" not in str(e):
            raise
        _raise_not_dlpack(zip(("q", "k", "v", "out", "lse"), args))
        raise
    adapter.finish(out, stream)
    return (out, lse) if return_lse else out


def _is_float8(x: Any) -> bool:
    """Whether x's dtype is float8_e4m3fn (PyTorch, JAX); other float8 formats are refused later by name."""
    return str(getattr(x, "dtype", "")).rsplit(".", 1)[-1] == "float8_e4m3fn"


DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")
# The backends that take float8_e4m3fn q, k, v.
FP8_BACKENDS = ("auto", "wgmma")


def check_fp8(q: Any, backend: str, descales: tuple) -> bool:
    """Whether q is float8_e4m3fn, for every front end (eager, the torch op, JAX's custom call):
    descale factors apply to FP8 inputs only, which run on FP8_BACKENDS. k's and v's dtypes are
    checked with the other dtype rules (they must share q's)."""
    fp8 = _is_float8(q)
    if not fp8:
        if any(d is not None for d in descales):
            raise ValueError("q_descale, k_descale and v_descale apply to float8_e4m3fn inputs; "
                             f"q has dtype {getattr(q, 'dtype', None)}")
    elif backend not in FP8_BACKENDS:
        raise ValueError(f"float8_e4m3fn q, k, v run on the 'wgmma' backend (Hopper; or 'auto', which picks it); "
                         f"got backend {backend!r}")
    return fp8


def fp8_no_backward(advice: str) -> str:
    """The message of a differentiation through an FP8 call, with the framework's way around it."""
    return f"float8_e4m3fn attention has no backward pass (FP8 is forward only); {advice}"


def map_descales(descales: tuple, q: Any, k: Any, convert: Any) -> tuple:
    """The given descale factors (q's, k's, v's; None stays None) through convert(d, arg, batch,
    heads_kv), with batch from q's shape and heads_kv from k's: what every FP8 front end does."""
    batch, heads_kv = _check_shape(q, "q")[0], _check_shape(k, "k")[2]
    return tuple(None if d is None else convert(d, name, batch, heads_kv) for name, d in zip(DESCALE_NAMES, descales))


def check_descale(d: Any, arg: str, framework: str, batch: int, heads_kv: int) -> bool:
    """A descale factor checked against the FP8 convention: a finite float (True is returned) or a
    float32 array of q's framework with shape (batch, heads_kv) or one element (False)."""
    if isinstance(d, (int, float)) and not isinstance(d, bool):
        if not math.isfinite(d):
            raise ValueError(f"{arg} must be finite; got {d}")
        return True
    if not hasattr(d, "shape") or isinstance(d, bool) or _adapter_for(d, arg).name != framework:
        raise TypeError(f"{arg} must be a float or a float32 {framework} array like q; "
                        f"got {type(d).__module__}.{type(d).__qualname__}")
    dtype = str(d.dtype).rsplit(".", 1)[-1]
    if dtype != "float32":
        raise TypeError(f"{arg} must have dtype float32; got {dtype}")
    shape = tuple(d.shape)
    if shape != (batch, heads_kv) and math.prod(shape) != 1:
        raise ValueError(f"{arg} must have shape (batch, heads_kv) = ({batch}, {heads_kv}) or one element; "
                         f"got shape {shape}")
    return False


def _descale_array(framework: str, d: Any, like: Any, batch: int, heads_kv: int, arg: str) -> Any:
    """A descale factor as the float32 (batch, heads_kv) array the kernel reads: a float becomes one
    (on like's device), an array of one element is repeated (stride 0 where the framework allows)."""
    if check_descale(d, arg, framework, batch, heads_kv):
        if framework == "torch":
            import torch

            return torch.full((1, 1), float(d), dtype=torch.float32, device=like.device).expand(batch, heads_kv)
        import jax.numpy as jnp

        return jnp.full((batch, heads_kv), float(d), dtype=jnp.float32, device=like.device)
    if tuple(d.shape) != (batch, heads_kv):
        d = d.reshape(1, 1)
        d = d.expand(batch, heads_kv) if framework == "torch" else d.repeat(batch, 0).repeat(heads_kv, 1)
    return d


def resolve_backend(q: Any, k: Any, v: Any, *, causal: bool = False, backend: str = "auto",
                    backward: bool = False, deterministic: bool = False) -> str:
    """The backend ``attention`` (or, with ``backward=True``, ``attention_backward``, with
    ``deterministic`` as that call's) would run for these tensors; ValueError says why if none can."""
    check_backend(backend)
    causal = check_flag(causal, "causal")
    backward = check_flag(backward, "backward")
    deterministic = check_flag(deterministic, "deterministic")
    if backward:
        _check_backward_backend(backend)
        return _ask_about_qkv(_waveboost.resolve_backward_backend, q, k, v, causal, backend, deterministic)
    if deterministic:
        raise ValueError("deterministic=True describes a backward call: pass backward=True too "
                         "(every forward is deterministic)")
    return _ask_about_qkv(_waveboost.resolve_backend, q, k, v, causal, backend)


def _ask_about_qkv(query, q: Any, k: Any, v: Any, *rest):
    """query(q, k, v, *rest) of the compiled module on q, k, v of one framework, viewed as DLPack
    tensors (nothing runs on them)."""
    q, k, v = (_host_view(t, name) for name, t in (("q", q), ("k", k), ("v", v)))
    adapter = _adapter_for(q, "q")
    for name, t in (("k", k), ("v", v)):
        other = _adapter_for(t, name)
        if other.name != adapter.name:
            raise TypeError(f"{name} is a {other.name} array but q is a {adapter.name} array; use one framework")
    prep = adapter.prepare
    args = (prep(q, "q"), prep(k, "k"), prep(v, "v"))
    try:
        return query(*args, *rest)
    except TypeError as e:
        if "incompatible function arguments" not in str(e):
            raise
        _raise_not_dlpack(zip(("q", "k", "v"), args))
        raise


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------


def backward_backends() -> tuple:
    """The backends that have a backward pass (``"auto"`` included)."""
    return tuple(b for b in BACKENDS if _waveboost.backend_has_backward(b))


def _check_backward_backend(backend: Any) -> None:
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, one of {backward_backends()}; got {type(backend).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {backward_backends()} for the backward pass; got {backend!r}")
    if not _waveboost.backend_has_backward(backend):
        raise ValueError(f"backend {backend!r} is forward-only: it has no backward pass; "
                         f"the backends with one are {backward_backends()}")


def attention_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    dlse: Any = None,
    dq: Any = None,
    dk: Any = None,
    dv: Any = None,
    deterministic: bool = False,
    backend: str = "auto",
) -> tuple:
    """Gradients of ``attention(q, k, v)`` with respect to q, k and v.

    Args:
        dout: the gradient flowing into the output, q's shape and dtype.
        q, k, v: the forward's inputs (same conventions as ``attention``: BSHD, GQA/MQA,
            bottom-right causal mask).
        out, lse: the forward's output and its float32 (batch, heads, seqlen_q) logsumexp
            (``attention(..., return_lse=True)``), with the same ``causal`` and ``softmax_scale``.
        dlse: optional gradient flowing into ``lse`` (float32, lse's shape); it adds
            ``dlse * P`` to the score gradient.
        dq, dk, dv: optional preallocated outputs (q's, k's and v's shapes). With GQA, dk and dv
            of a kv head sum over the query heads that read it.
        deterministic: bitwise-reproducible gradients (a fixed reduction order on every backend).
        backend: "auto" or a backend with a backward pass (``backward_backends()``).

    Returns:
        ``(dq, dk, dv)``, arrays of ``q``'s framework on its device, computed on the caller's stream.
    """
    _check_backward_backend(backend)
    softmax_scale = check_softmax_scale(softmax_scale)
    adapter = _adapter_for(q, "q")
    given = {"dout": dout, "k": k, "v": v, "out": out, "lse": lse, "dlse": dlse, "dq": dq, "dk": dk, "dv": dv}
    for name, t in given.items():
        if t is None:
            if name in ("dout", "k", "v", "out", "lse"):
                raise TypeError(f"{name} is required; got None")
            continue
        other = _adapter_for(t, name)
        if other.name != adapter.name:
            raise TypeError(f"{name} is a {other.name} array but q is a {adapter.name} array; use one framework")
    outputs_given = dq is not None or dk is not None or dv is not None
    if adapter.name == "jax":
        from . import jax as waveboost_jax

        if not outputs_given and waveboost_jax.ffi_available() and hasattr(waveboost_jax, "attention_backward"):
            return waveboost_jax.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                                    softmax_scale=softmax_scale, dlse=dlse,
                                                    deterministic=deterministic, backend=backend)
        arrays = (dout, q, k, v, out, lse, dlse, dq, dk, dv)
        if outputs_given and any(isinstance(x, waveboost_jax.jax.core.Tracer) for x in arrays):
            raise TypeError("dq=, dk= and dv= need concrete JAX arrays (they write into existing buffers); "
                            "under jit or vmap call waveboost.attention_backward without them")
        waveboost_jax._check_dlpack_fallback(arrays, False)
    qshape = _check_shape(q, "q")
    kshape = _check_shape(k, "k")
    vshape = _check_shape(v, "v")
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        if t is not None and getattr(getattr(t, "flags", None), "writeable", True) is False:
            raise ValueError(f"{name} must be writeable; got a read-only array")
    dq = adapter.empty(q, qshape, "like") if dq is None else dq
    dk = adapter.empty(k, kshape, "like") if dk is None else dk
    dv = adapter.empty(v, vshape, "like") if dv is None else dv
    stream = adapter.stream(q)
    prep = adapter.prepare
    _waveboost.backward(
        prep(dout, "dout"), prep(q, "q"), prep(k, "k"), prep(v, "v"), prep(out, "out"), prep(lse, "lse"),
        prep(dq, "dq"), prep(dk, "dk"), prep(dv, "dv"), None if dlse is None else prep(dlse, "dlse"),
        bool(causal), softmax_scale, bool(deterministic), backend, stream,
    )
    adapter.finish(dq, stream)
    return dq, dk, dv


def info() -> dict:
    """Version, CUDA build facts, the GPUs seen, the backends this machine can run (on GPU 0), and the
    CPU path's instruction set ("avx512", "avx2" or "baseline") and thread count."""
    gpus = [_waveboost.cuda_device_description(i) for i in range(_waveboost.cuda_device_count())]
    backends = [record["backend"] for record in capabilities() if record["available"]]
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


def capabilities(device: int = 0) -> list:
    """What each backend compiled into this build can run, one record (a dict) per backend.

    Keys: ``backend`` (a name ``backend=`` takes), ``device`` ("cpu" or "cuda"), ``requires``
    (in words), ``available`` (this machine can run it now; for CUDA backends on GPU ``device``)
    and ``reason`` (why not, else None), ``passes`` ("forward", "backward"), ``forward_dtypes``
    and ``backward_dtypes``, ``head_dims`` and ``backward_head_dims`` (those of the probed set,
    ``waveboost._waveboost.probed_head_dims()``, that run) and ``any_head_dim``, and the flags
    ``causal``, ``gqa``, ``varlen``, ``seqused``, ``paged`` and ``deterministic_backward``. The records come from each backend's own ``can_implement``, asked
    about synthetic calls (nothing runs), so they agree with what a call does; a backend that is
    not available has nothing probed (empty lists, false flags).
    """
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"device must be an int (a CUDA device ordinal); got {type(device).__name__}")
    archs = _waveboost.cuda_architectures()
    records = []
    for record in _waveboost.capabilities(device):
        record["requires"] = ("host memory" if record["device"] == "cpu"
                              else f"a CUDA device of an architecture this build targets ({archs})")
        record["passes"] = [name for name, dtypes in (("forward", record["forward_dtypes"]),
                                                      ("backward", record["backward_dtypes"])) if dtypes]
        records.append(record)
    return records


def plan(q: Any, k: Any, v: Any, *, causal: bool = False, backend: str = "auto") -> dict:
    """What ``attention(q, k, v, causal=causal, backend=backend)`` would launch, without running it:
    a dict with ``backend`` (``auto`` resolved), ``kernel`` (a ``name`` of ``kernels()``, or the
    backend's name for the paths outside the kernel table: ``cpu``, ``naive``), ``num_splits``
    (the pieces the keys are cut into and merged after, split-KV; 1 when unsplit) and ``merge``,
    how the pieces merge: ``in-kernel`` (the last piece to finish merges them), ``cluster`` (the pieces
    of a sequence and kv head run as one thread block cluster and merge through its shared memory;
    decode on sm_90), ``combine-kernel`` (a second kernel), or ``""`` when unsplit, and ``persistent``: whether the grid is one wave of
    blocks that take the query blocks in turn (wgmma's TMA kernel, non-causal calls) rather than a
    block per query block (``WAVEBOOST_WGMMA_PERSISTENT=0`` or ``1`` decides for every call it can
    take). The launchers decide
    through the same functions, so the answer is the call's. ValueError says why if the call cannot
    run."""
    check_backend(backend)
    causal = check_flag(causal, "causal")
    return dict(_ask_about_qkv(_waveboost.plan, q, k, v, causal, backend))


def kernels() -> list:
    """The CUDA kernels compiled into this build, one record (a dict) per row of the kernel
    registry that the CUDA backends dispatch through (generated from the table in
    ``src/cuda/kernels.py``); empty in a build without CUDA.

    Keys: ``name``, ``backend``, ``pass`` ("forward" or "backward"), ``variant`` ("" for the
    backend's general kernel, e.g. "tma" for a faster one it tries first), ``dtype``,
    ``head_dim``, ``min_compute_capability`` and ``max_compute_capability`` (major * 10 + minor;
    None: no upper bound), ``vector_elements`` (q/k/v/out move in 16-byte pieces of this many
    elements, so their base and strides must be multiples of it; 0: no alignment needed) and
    ``smem_bytes`` (shared memory per block; None where it depends on the call). What the rows
    need is necessary, not sufficient: ``capabilities()`` says what runs on a device.
    """
    return [dict(r) for r in _waveboost.kernel_table()]


# ---------------------------------------------------------------------------
# Serving: variable-length batches, KV caches (contiguous or paged), merging partial results.
# ---------------------------------------------------------------------------

def _check_backend_name(backend: Any) -> str:
    # The compiled module knows the full list (it includes "decode"); it raises ValueError naming it.
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str such as 'auto' or 'cpu'; got {type(backend).__name__}")
    return backend


def _one_framework(adapter: _Adapter, first: str, named: tuple) -> None:
    for name, t in named:
        if t is None:
            continue
        other = _adapter_for(t, name)
        if other.name != adapter.name:
            raise TypeError(f"{name} is a {other.name} array but {first} is a {adapter.name} array; use one framework")


def _to_host(x: Any):
    """A NumPy copy of an array of any supported framework (a device-to-host copy: synchronizes)."""
    import numpy as np

    module = type(x).__module__.split(".")[0]
    if module == "torch":
        return x.detach().cpu().numpy()
    if module == "cupy":
        return x.get()
    return np.asarray(x)


def _empty_int32(adapter: _Adapter, like: Any, shape: tuple) -> Any:
    if adapter.name == "numpy":
        import numpy as np

        return np.empty(shape, dtype=np.int32)
    if adapter.name == "torch":
        import torch

        return torch.empty(shape, dtype=torch.int32, device=like.device)
    if adapter.name == "cupy":
        import cupy

        with like.device:
            return cupy.empty(shape, dtype=cupy.int32)
    import jax.numpy as jnp

    return jnp.zeros(shape, dtype=jnp.int32, device=like.device)


def _stack(adapter: _Adapter, arrays: Any, arg: str) -> Any:
    arrays = list(arrays)
    if not arrays:
        raise ValueError(f"{arg} must hold at least one part; got an empty sequence")
    for i, a in enumerate(arrays):
        other = _adapter_for(a, f"{arg}[{i}]")
        if other.name != adapter.name:
            raise TypeError(f"{arg}[{i}] is a {other.name} array but {arg}[0] is a {adapter.name} array")
    if adapter.name == "numpy":
        import numpy as np

        return np.stack(arrays)
    if adapter.name == "torch":
        import torch

        return torch.stack(arrays)
    if adapter.name == "cupy":
        import cupy

        return cupy.stack(arrays)
    import jax.numpy as jnp

    return jnp.stack(arrays)


def _check_writeable(x: Any, arg: str) -> None:
    if getattr(getattr(x, "flags", None), "writeable", True) is False:
        raise ValueError(f"{arg} must be writeable; got a read-only array")
    if type(x).__module__.split(".")[0] == "torch" and x.is_neg():
        raise ValueError(f"{arg} must be a plain tensor; got a lazily negated view (torch._neg_view)")


def _check_jax_eager(arrays: tuple, what: str) -> None:
    import jax

    if any(isinstance(x, jax.core.Tracer) for x in arrays if x is not None):
        raise TypeError(
            f"{what} takes concrete JAX arrays only (it runs eagerly through DLPack); call it outside "
            "jax.jit / vmap"
        )


def _check_index(x: Any, arg: str, shape: tuple, layout: str) -> None:
    dtype = str(getattr(x, "dtype", type(x).__name__)).rsplit(".", 1)[-1]
    if dtype != "int32":
        raise TypeError(f"{arg} must have dtype int32; got {dtype}")
    got = tuple(getattr(x, "shape", ()))
    if got != shape:
        raise ValueError(f"{arg} must have shape {layout} = {shape}; got {got}")


def _max_length(cu_seqlens: Any, name: str = "cu_seqlens") -> int:
    import numpy as np

    cu = _to_host(cu_seqlens).astype(np.int64).reshape(-1)
    return int(np.max(np.diff(cu))) if cu.size > 1 else 0


def varlen_args(q_shape: tuple, cu_seqlens_q: Any, cu_seqlens_k: Any, block_table: Any, seqused_k: Any,
                max_seqlen_q: Any, max_seqlen_k: Any) -> tuple:
    """The argument rules of ``attention_varlen`` that waveboost and waveboost.jax share: the offsets
    it needs, q's packed rank, the max_seqlen types, and a paged call's cu_seqlens_k turned into
    seqused_k (its differences, computed on the device). Returns ``(cu_seqlens_k, seqused_k)``."""
    if cu_seqlens_q is None:
        raise ValueError("cu_seqlens_q is required: int32 (batch + 1,) offsets of each sequence's queries in q")
    if cu_seqlens_k is None and block_table is None:
        raise ValueError("cu_seqlens_k is required without block_table: int32 (batch + 1,) offsets of each "
                         "sequence's keys in k")
    if len(q_shape) != 3:
        raise ValueError(f"q must be a 3-D tensor (total_q, heads, head_dim); got shape {q_shape}")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if value is not None and (isinstance(value, bool) or not hasattr(value, "__index__")):
            raise TypeError(f"{name} must be an int or None; got {type(value).__name__}")
    if block_table is not None and cu_seqlens_k is not None:
        if seqused_k is None:
            seqused_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        cu_seqlens_k = None
    return cu_seqlens_k, seqused_k


def varlen_max_lengths(cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any, max_seqlen_k: Any,
                       read_max: Callable[[Any, str], int]) -> tuple:
    """``(max_seqlen_q, max_seqlen_k)`` as ints: the given bounds, else ``read_max(cu_seqlens, name)``
    (a host read); max_seqlen_k is 0 (unused) without cu_seqlens_k (a paged cache)."""
    if max_seqlen_q is None:
        max_seqlen_q = read_max(cu_seqlens_q, "cu_seqlens_q")
    if max_seqlen_k is None:
        max_seqlen_k = 0 if cu_seqlens_k is None else read_max(cu_seqlens_k, "cu_seqlens_k")
    return int(max_seqlen_q), int(max_seqlen_k)


def _validate_cu_seqlens(cu_seqlens: Any, arg: str, total: int, max_seqlen: Optional[int]) -> Any:
    import numpy as np

    cu = _to_host(cu_seqlens).astype(np.int64).reshape(-1)
    if cu.size == 0 or cu[0] != 0:
        raise ValueError(f"{arg} must start at 0; got {cu[:1].tolist()}")
    lengths = np.diff(cu)
    if np.any(lengths < 0):
        b = int(np.argmax(lengths < 0))
        raise ValueError(f"{arg} must be non-decreasing; got {arg}[{b}] = {cu[b]} > {arg}[{b + 1}] = {cu[b + 1]}")
    if cu[-1] > total:
        raise ValueError(f"{arg}[-1] = {cu[-1]} exceeds the {total} packed rows of its tensor")
    if max_seqlen is not None and lengths.size and lengths.max() > max_seqlen:
        raise ValueError(f"a sequence of {arg} has {lengths.max()} rows, more than max_seqlen {max_seqlen}")
    return lengths


def _validate_pages(block_table: Any, lengths: Any, page_size: int, num_pages: int, arg: str = "block_table") -> None:
    import numpy as np

    table = _to_host(block_table).astype(np.int64)
    for b, length in enumerate(np.asarray(lengths).tolist()):
        used = table[b, : -(-int(length) // page_size)]
        bad = (used < 0) | (used >= num_pages)
        if np.any(bad):
            j = int(np.argmax(bad))
            raise ValueError(f"{arg}[{b}, {j}] = {used[j]} is not a page id in [0, {num_pages})")


def _validate_used(lengths: Any, capacity: Any, arg: str, capacity_name: str) -> None:
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    capacity = np.broadcast_to(np.asarray(capacity, dtype=np.int64), lengths.shape)
    bad = (lengths < 0) | (lengths > capacity)
    if np.any(bad):
        b = int(np.argmax(bad))
        raise ValueError(f"{arg}[{b}] = {lengths[b]} is outside [0, {capacity[b]}] ({capacity_name})")


def attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    *,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    block_table: Any = None,
    seqused_k: Any = None,
    out: Any = None,
    return_lse: bool = False,
    backend: str = "auto",
    validate: bool = False,
) -> Any:
    """Attention over a batch of variable-length sequences packed along one axis.

    The semantics of flash-attn's ``flash_attn_varlen_func``: sequence ``b`` owns query rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and key rows ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``;
    the causal mask is aligned bottom-right per sequence; a query that sees no key (an empty key
    sequence, or causal with more queries than keys) outputs zeros and LSE ``-inf``.

    Args:
        q: (total_q, heads, head_dim), unit last stride.
        k, v: (total_k, heads_kv, head_dim); or, with ``block_table``, a paged cache
            (num_pages, page_size, heads_kv, head_dim) where key ``j`` of sequence ``b`` is row
            ``j % page_size`` of page ``block_table[b, j // page_size]``.
        cu_seqlens_q: int32 (batch + 1,), non-decreasing, starting at 0.
        cu_seqlens_k: int32 (batch + 1,). With ``block_table`` it may be None (the lengths then come
            from ``seqused_k``, or are every page of the table row); if given there and
            ``seqused_k`` is not, its differences are used as ``seqused_k`` (computed on the device).
        max_seqlen_q, max_seqlen_k: upper bounds on the sequence lengths (they size the launch).
            **When omitted they are read from cu_seqlens on the host**: a device-to-host copy that
            synchronizes with the device (and cannot be captured in a CUDA graph); pass them to
            avoid it. ``max_seqlen_k`` is not needed with ``block_table``.
        causal: bottom-right aligned per sequence: query ``i`` of a sequence with ``Lq`` queries and
            ``Lk`` keys sees keys ``j <= i + Lk - Lq``.
        softmax_scale: multiplies ``q @ k^T``; defaults to ``1 / sqrt(head_dim)``.
        block_table: int32 (batch, max_pages): page ids of each sequence (paged K/V).
        seqused_k: int32 (batch,): keys each sequence actually uses (a cache's fill); takes
            precedence over cu_seqlens_k's lengths.
        out: optional preallocated output, q's shape, dtype and device. Rows of ``q`` past
            ``cu_seqlens_q[-1]`` are not written.
        return_lse: also return the float32 (heads, total_q) natural-log logsumexp.
        backend: "auto" or a backend whose ``can_implement`` accepts sequence layouts ("cpu";
            on CUDA "decode", and "mma" / "wgmma" for float16 and bfloat16 with page sizes that are
            powers of two); an unsupported one raises ValueError saying why.
        validate: copy the index arrays to the host (synchronizes) and check them first:
            cu_seqlens start at 0, are non-decreasing and stay within the packed rows; lengths fit
            max_seqlen_*; seqused_k within each sequence's capacity; page ids in range. Raises
            ValueError. Without it, only shapes, dtypes and devices are checked: no device memory is
            read on the host (the CPU backend always checks the indices it reads).

    Returns:
        ``out`` or ``(out, lse)``, arrays of ``q``'s framework.

    Differences from flash-attn: no dropout, window, softcap or ALiBi; ``out`` may be passed; the
    kernels never read ``max_seqlen_*`` beyond sizing, so too small a bound is an error caught only by
    ``validate=True`` (or the CPU backend).
    """
    backend = _check_backend_name(backend)
    softmax_scale = check_softmax_scale(softmax_scale)
    adapter = _adapter_for(q, "q")
    _one_framework(adapter, "q", (("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                                  ("block_table", block_table), ("seqused_k", seqused_k), ("out", out)))
    if adapter.name == "jax":
        from . import jax as waveboost_jax

        if out is None and not validate and waveboost_jax.varlen_ffi_available():
            # XLA's route: works under jit (with max_seqlen_* given there).
            return waveboost_jax.attention_varlen(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                causal=causal, softmax_scale=softmax_scale, block_table=block_table, seqused_k=seqused_k,
                return_lse=return_lse, backend=backend)
        _check_jax_eager((q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, out), "attention_varlen")
    shape = tuple(getattr(q, "shape", ()))
    cu_seqlens_k, seqused_k = varlen_args(shape, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q,
                                          max_seqlen_k)
    if validate:
        _validate_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", shape[0], max_seqlen_q)
        k_shape = tuple(getattr(k, "shape", ()))
        batch = len(_to_host(cu_seqlens_q).reshape(-1)) - 1
        if cu_seqlens_k is not None:
            capacity = _validate_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k_shape[0] if k_shape else 0, max_seqlen_k)
            capacity_name = "its cu_seqlens_k length"
        elif block_table is not None and len(k_shape) == 4:
            capacity = tuple(getattr(block_table, "shape", (0, 0)))[-1] * k_shape[1]
            capacity_name = "max_pages * page_size"
        else:
            capacity = None
        used = _to_host(seqused_k).reshape(-1) if seqused_k is not None else None
        if used is not None and capacity is not None:
            _validate_used(used, capacity, "seqused_k", capacity_name)
        if block_table is not None and len(k_shape) == 4 and k_shape[1] > 0:
            lengths = used if used is not None else [capacity] * batch
            _validate_pages(block_table, lengths, k_shape[1], k_shape[0])
    max_seqlen_q, max_seqlen_k = varlen_max_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                    _max_length)
    if out is not None:
        _check_writeable(out, "out")
    else:
        out = adapter.empty(q, shape, "like")
    lse = adapter.empty(q, (shape[1], shape[0]), "float32") if return_lse else None
    stream = adapter.stream(q)
    prep = adapter.prepare

    def opt(x, name):
        return None if x is None else prep(x, name)

    _waveboost.forward_sequences(
        prep(q, "q"), prep(k, "k"), prep(v, "v"), prep(out, "out"), opt(lse, "lse"), prep(cu_seqlens_q, "cu_seqlens_q"),
        opt(cu_seqlens_k, "cu_seqlens_k"), opt(seqused_k, "seqused_k"), opt(block_table, "block_table"),
        max_seqlen_q, max_seqlen_k, bool(causal), softmax_scale, backend, stream,
    )
    adapter.finish(out, stream)
    return (out, lse) if return_lse else out


def attention_with_kvcache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    cache_seqlens: Any,
    *,
    block_table: Any = None,
    k_new: Any = None,
    v_new: Any = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    out: Any = None,
    return_lse: bool = False,
    backend: str = "auto",
    validate: bool = False,
) -> Any:
    """Attention of a few new queries per sequence against a KV cache (decode, speculative
    verify, chunked prefill), optionally appending new keys/values to the cache first.

    Args:
        q: (batch, seqlen_q, heads, head_dim).
        k_cache, v_cache: a contiguous cache (batch, max_len, heads_kv, head_dim), or with
            ``block_table`` a paged one (num_pages, page_size, heads_kv, head_dim).
        cache_seqlens: int32 (batch,): keys already in each sequence's cache.
        block_table: int32 (batch, max_pages): page ids of each sequence.
        k_new, v_new: optional (batch, seqlen_new, heads_kv, head_dim). Written into the cache at
            positions ``cache_seqlens[b] + i`` before attending (in place for NumPy, PyTorch and
            CuPy); the attention then uses ``cache_seqlens + seqlen_new`` keys per sequence, a length
            computed on the device. ``cache_seqlens`` itself is not changed: advance it yourself.
        causal: bottom-right aligned per sequence: query ``i`` sees keys
            ``j <= i + seqlen_k_b - seqlen_q``, where ``seqlen_k_b`` counts the appended keys.
        softmax_scale: defaults to ``1 / sqrt(head_dim)``.
        out: optional preallocated output (q's shape, dtype, device).
        return_lse: also return the float32 (batch, heads, seqlen_q) logsumexp.
        backend: "auto" or a backend that accepts sequence layouts ("cpu"; on CUDA "decode", "mma", "wgmma").
        validate: copy cache_seqlens (and block_table) to the host (synchronizes) and check that
            ``cache_seqlens + seqlen_new`` fits the capacity and that the pages in use are in
            range; ValueError otherwise. Without it nothing is read on the host, so a decode step
            can be captured in a CUDA graph.

    Returns:
        ``out`` or ``(out, lse)``. JAX arrays are immutable: with ``k_new`` a JAX call returns
        ``(out, k_cache, v_cache)`` or ``(out, lse, k_cache, v_cache)`` with the updated caches.
        JAX arrays go through ``waveboost.jax.attention_with_kvcache`` (an XLA custom call, usable
        under ``jit``; with the caches donated XLA updates them in place) when this build has the
        XLA FFI handlers. Otherwise (or with ``out=`` or ``validate=True``) they take an eager
        DLPack route that copies each cache before appending.
    """
    backend = _check_backend_name(backend)
    softmax_scale = check_softmax_scale(softmax_scale)
    adapter = _adapter_for(q, "q")
    _one_framework(adapter, "q", (("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens),
                                  ("block_table", block_table), ("k_new", k_new), ("v_new", v_new), ("out", out)))
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new go together: give both or neither")
    shape = _check_shape(q, "q")
    appending = k_new is not None
    if appending:
        new_shape = tuple(getattr(k_new, "shape", ()))
        if len(new_shape) != 4:
            raise ValueError(f"k_new must be a 4-D tensor (batch, seqlen_new, heads_kv, head_dim); got shape {new_shape}")
        if new_shape[0] != shape[0]:
            raise ValueError(f"k_new has batch {new_shape[0]} but q has {shape[0]}; they must match")
    # Named here: the compiled call sees cache_seqlens as the forward's seqused_k.
    _check_index(cache_seqlens, "cache_seqlens", (shape[0],), "(batch,)")
    is_jax = adapter.name == "jax"
    if is_jax:
        from . import jax as waveboost_jax

        if out is None and not validate and waveboost_jax.kvcache_ffi_available():
            # XLA's route: works under jit, the cache results alias the cache operands.
            return waveboost_jax.attention_with_kvcache(
                q, k_cache, v_cache, cache_seqlens, block_table=block_table, k_new=k_new, v_new=v_new,
                causal=causal, softmax_scale=softmax_scale, return_lse=return_lse, backend=backend)
        _check_jax_eager((q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, out),
                         "attention_with_kvcache")
    if validate:
        cache_shape = tuple(getattr(k_cache, "shape", ()))
        seqlen_new = new_shape[1] if appending else 0
        lengths = _to_host(cache_seqlens).astype("int64").reshape(-1) + seqlen_new
        if len(cache_shape) == 4:
            if block_table is not None:
                capacity = tuple(getattr(block_table, "shape", (0, 0)))[-1] * cache_shape[1]
                name = "max_pages * page_size"
            else:
                capacity, name = cache_shape[1], "the cache's max_len"
            _validate_used(lengths, capacity, "cache_seqlens + seqlen_new" if appending else "cache_seqlens", name)
            if block_table is not None and cache_shape[1] > 0:
                _validate_pages(block_table, lengths, cache_shape[1], cache_shape[0])
    if out is not None:
        _check_writeable(out, "out")
    else:
        out = adapter.empty(q, shape, "like")
    lse = adapter.empty(q, (shape[0], shape[2], shape[1]), "float32") if return_lse else None
    stream = adapter.stream(q)
    prep = adapter.prepare
    seqused = cache_seqlens
    if appending:
        if is_jax:
            import jax.numpy as jnp

            k_cache, v_cache = jnp.array(k_cache, copy=True), jnp.array(v_cache, copy=True)
        else:
            _check_writeable(k_cache, "k_cache")
            _check_writeable(v_cache, "v_cache")
        seqused = _empty_int32(adapter, q, (shape[0],))
        _waveboost.kv_cache_append(
            prep(k_cache, "k_cache"), prep(v_cache, "v_cache"), prep(k_new, "k_new"), prep(v_new, "v_new"),
            prep(cache_seqlens, "cache_seqlens"), prep(seqused, "seqused"),
            None if block_table is None else prep(block_table, "block_table"), stream,
        )
    _waveboost.forward_sequences(
        prep(q, "q"), prep(k_cache, "k_cache"), prep(v_cache, "v_cache"), prep(out, "out"),
        None if lse is None else prep(lse, "lse"), None, None, prep(seqused, "cache_seqlens"),
        None if block_table is None else prep(block_table, "block_table"), None, None, bool(causal), softmax_scale,
        backend, stream,
    )
    adapter.finish(out, stream)
    result = (out, lse) if return_lse else (out,)
    if is_jax and appending:
        return result + (k_cache, v_cache)
    return result if return_lse else out


def merge_attention_states(outs: Any, lses: Any, *, out: Any = None, return_lse: bool = True) -> Any:
    """Merges attention computed over disjoint key sets into attention over their union, exactly:
    ``lse = log(sum_i exp(lse_i))`` and ``out = sum_i exp(lse_i - lse) * out_i``.

    A part whose ``lse_i`` is ``-inf`` (it saw no key) contributes nothing; a row where every part is
    ``-inf`` comes out as zeros with ``lse = -inf``.

    Args:
        outs: (num_parts, batch, seqlen, heads, head_dim), or a sequence of num_parts
            (batch, seqlen, heads, head_dim) arrays (stacked first: one copy).
        lses: float32 (num_parts, batch, heads, seqlen), or a sequence of (batch, heads, seqlen).
        out: optional (batch, seqlen, heads, head_dim) output; its dtype may differ from outs'
            (e.g. float32 partials merged into bfloat16). Defaults to outs' dtype.
        return_lse: also return the merged float32 (batch, heads, seqlen) logsumexp.

    Returns:
        ``(out, lse)`` (the default) or ``out``.
    """
    if isinstance(outs, (list, tuple)) and not outs:
        raise ValueError("outs must hold at least one part; got an empty sequence")
    first = outs[0] if isinstance(outs, (list, tuple)) else outs
    adapter = _adapter_for(first, "outs")
    if adapter.name == "jax" and out is None:
        from . import jax as waveboost_jax

        if waveboost_jax.merge_ffi_available():
            # XLA's route: works under jit too.
            return waveboost_jax.merge_attention_states(outs, lses, return_lse=return_lse)
    if isinstance(outs, (list, tuple)):
        outs = _stack(adapter, outs, "outs")
    if isinstance(lses, (list, tuple)):
        lses = _stack(adapter, lses, "lses")
    _one_framework(adapter, "outs", (("lses", lses), ("out", out)))
    if adapter.name == "jax":
        _check_jax_eager((outs, lses, out), "merge_attention_states")
    shape = tuple(getattr(outs, "shape", ()))
    if len(shape) != 5:
        raise ValueError(f"outs must be (num_parts, batch, seqlen, heads, head_dim) or a sequence of "
                         f"(batch, seqlen, heads, head_dim) arrays; got shape {shape}")
    if out is not None:
        _check_writeable(out, "out")
    else:
        out = adapter.empty(outs, shape[1:], "like")
    lse = adapter.empty(outs, (shape[1], shape[3], shape[2]), "float32") if return_lse else None
    stream = adapter.stream(outs)
    prep = adapter.prepare
    _waveboost.merge_attention_states(prep(outs, "outs"), prep(lses, "lses"), prep(out, "out"),
                                      None if lse is None else prep(lse, "lse"), stream)
    adapter.finish(out, stream)
    return (out, lse) if return_lse else out
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
