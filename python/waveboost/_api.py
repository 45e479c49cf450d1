"""The public Python API: framework detection, output allocation, streams.

Kernels never see a framework: each adapter below allocates `out` (and `lse`)
with the caller's own framework, finds the stream the caller is working on,
and hands DLPack-capable tensors to the compiled module.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

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

    return _Adapter("numpy", empty, lambda x: 0, _identity, _noop_finish)


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
    raise TypeError(
        f"{arg} must be a NumPy, PyTorch, CuPy or JAX array; got {type(x).__module__}.{type(x).__qualname__}"
    )


def _check_shape(x: Any, arg: str) -> tuple:
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) != 4:
        raise ValueError(f"{arg} must be a 4-D tensor (batch, seqlen, heads, head_dim); got shape {shape}")
    return shape


def _torch_needs_grad(tensors: tuple) -> bool:
    """Whether autograd would record an op on these torch tensors."""
    if not any(t.requires_grad for t in tensors):
        return False
    import torch

    return torch.is_grad_enabled()


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

    PyTorch tensors that require grad (with grad mode on) go through ``waveboost.torch.attention``,
    which autograd differentiates; ``out=`` is refused there. Gradients otherwise come from
    ``attention_backward``.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, one of {BACKENDS}; got {type(backend).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if softmax_scale is not None:
        if isinstance(softmax_scale, (bool, str, bytes)) or not hasattr(softmax_scale, "__float__"):
            raise TypeError(f"softmax_scale must be a float or None; got {type(softmax_scale).__name__}")
        softmax_scale = float(softmax_scale)
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale must be a finite number; got {softmax_scale}")
    adapter = _adapter_for(q, "q")
    for name, t in (("k", k), ("v", v)) + ((("out", out),) if out is not None else ()):
        other = _adapter_for(t, name)
        if other.name != adapter.name:
            raise TypeError(f"{name} is a {other.name} array but q is a {adapter.name} array; use one framework")
    if adapter.name == "torch" and _torch_needs_grad((q, k, v)):
        # Differentiable route: the waveboost::attention custom op and its autograd formula.
        if out is not None:
            raise ValueError("out= cannot be used when q, k or v requires grad (with grad mode on): the result "
                             "must be a new tensor for autograd to differentiate; drop out=, or call under "
                             "torch.no_grad()")
        from . import torch as waveboost_torch

        return waveboost_torch.attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                         return_lse=return_lse, backend=backend)
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
    _waveboost.forward(
        prep(q, "q"), prep(k, "k"), prep(v, "v"), prep(out, "out"), None if lse is None else prep(lse, "lse"),
        bool(causal), softmax_scale, backend, stream,
    )
    adapter.finish(out, stream)
    return (out, lse) if return_lse else out


def resolve_backend(q: Any, k: Any, v: Any, *, causal: bool = False, backend: str = "auto",
                    backward: bool = False) -> str:
    """The backend ``attention`` (or, with ``backward=True``, ``attention_backward``) would run
    for these tensors; ValueError says why if none can."""
    adapter = _adapter_for(q, "q")
    prep = adapter.prepare
    if backward:
        _check_backward_backend(backend)
        return _waveboost.resolve_backward_backend(prep(q, "q"), prep(k, "k"), prep(v, "v"), bool(causal), backend)
    return _waveboost.resolve_backend(prep(q, "q"), prep(k, "k"), prep(v, "v"), bool(causal), backend)


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


def _check_scale(softmax_scale: Any) -> Optional[float]:
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, (bool, str, bytes)) or not hasattr(softmax_scale, "__float__"):
        raise TypeError(f"softmax_scale must be a float or None; got {type(softmax_scale).__name__}")
    softmax_scale = float(softmax_scale)
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be a finite number; got {softmax_scale}")
    return softmax_scale


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
    softmax_scale = _check_scale(softmax_scale)
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
    """Version, CUDA build facts, the GPUs seen and the backends this machine can run (on GPU 0)."""
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
    }
