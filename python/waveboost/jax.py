"""JAX integration: waveboost attention as an XLA FFI custom call.

``waveboost.jax.attention`` lowers to a custom call whose handlers (src/python/jax_ffi.cpp) live
in waveboost's compiled module. XLA allocates the outputs and runs the kernel on its own stream,
so the call works under ``jax.jit`` and ``jax.vmap`` and eagerly alike, with no synchronization.
``waveboost.attention`` sends JAX arrays here too when the handlers are present.

The handlers exist only when waveboost was built where jaxlib's FFI headers could be found
(``pip install --no-build-isolation .`` with jax installed); ``ffi_available()`` says whether they
are. Without them, ``waveboost.jax.attention`` raises ``RuntimeError`` and ``waveboost.attention``
still takes JAX arrays eagerly through DLPack (outside ``jit``, synchronizing its own stream).

Differentiable in reverse mode: ``attention`` is a ``jax.custom_vjp`` whose backward is a second
custom call (target ``waveboost_attention_backward``), so ``jax.grad``, ``jax.vjp`` and
``jax.checkpoint`` work, under ``jit`` and ``vmap`` too. A cotangent flowing into the returned lse
is honoured. Forward-mode differentiation (``jax.jvp``, ``jax.jacfwd``) is not provided.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _waveboost
from ._api import BACKENDS

__all__ = ["BACKWARD_TARGET_NAME", "TARGET_NAME", "attention", "attention_backward", "ffi_available", "ring_attention",
           "shard_sequence", "unshard_sequence"]

#: The XLA custom-call target the handlers are registered under, for both platforms.
TARGET_NAME = "waveboost_attention"

# Exported C symbols of _waveboost, per XLA platform name (cmake/jax_ffi.cmake builds them).
_HANDLER_SYMBOLS = {"cpu": "waveboost_jax_attention_cpu", "CUDA": "waveboost_jax_attention_cuda"}
_SUPPORTED_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


@functools.cache
def _registered_platforms() -> tuple[str, ...]:
    """Registers the handlers this build has with XLA (once) and returns their platforms."""
    library = ctypes.CDLL(_waveboost.__file__)  # the already-loaded module: dlopen hands back its handle
    platforms = []
    for platform, symbol in _HANDLER_SYMBOLS.items():
        handler = getattr(library, symbol, None)
        if handler is not None:
            jax.ffi.register_ffi_target(TARGET_NAME, jax.ffi.pycapsule(handler), platform=platform)
            platforms.append(platform)
    return tuple(platforms)


def ffi_available() -> bool:
    """Whether this build of waveboost carries the XLA FFI handlers (and registers them)."""
    return "cpu" in _registered_platforms()


def _require_ffi(arrays: tuple[Any, ...]) -> None:
    platforms = _registered_platforms()
    if not platforms:
        raise RuntimeError(
            "waveboost.jax needs waveboost's XLA FFI handlers, and this build has none: jaxlib's FFI "
            "headers were not found when waveboost was built (pip's isolated build has no jax). Reinstall "
            "with jax installed: pip install --no-build-isolation . (or pass "
            "-Ccmake.define.WAVEBOOST_XLA_FFI_INCLUDE_DIR=<jax.ffi.include_dir()>). Meanwhile "
            "waveboost.attention takes JAX arrays eagerly, outside jit."
        )
    if "CUDA" not in platforms:
        for x in arrays:
            concrete = isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
            if concrete and any(d.platform == "gpu" for d in x.devices()):
                raise RuntimeError(
                    "waveboost was built without CUDA, so its XLA FFI handler runs on the CPU only; "
                    f"got arrays on {sorted(str(d) for d in x.devices())}"
                )


def _check_dlpack_fallback(arrays: tuple[Any, ...], out_given: bool) -> None:
    """waveboost.attention's DLPack route needs concrete arrays: say why a traced call cannot take it."""
    if not any(isinstance(x, jax.core.Tracer) for x in arrays):
        return
    if out_given:
        raise TypeError("out= needs concrete JAX arrays (it writes into an existing buffer); "
                        "under jit or vmap call waveboost.attention without out=")
    _require_ffi(())


def _check_inputs(q: Any, k: Any, v: Any, backend: str) -> None:
    """Trace-time checks, so mistakes raise here with a message instead of inside XLA."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    for name, x, layout in (("q", q, "(batch, seqlen_q, heads, head_dim)"),
                            ("k", k, "(batch, seqlen_k, heads_kv, head_dim)"),
                            ("v", v, "(batch, seqlen_k, heads_kv, head_dim)")):
        if jnp.ndim(x) != 4:
            raise ValueError(f"{name} must be a 4-D array {layout}; got shape {jnp.shape(x)}")
    dtype = jnp.result_type(q)
    if dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"q must have dtype float16, bfloat16, float32 or float64; got {dtype}")
    for name, x in (("k", k), ("v", v)):
        if jnp.result_type(x) != dtype:
            raise TypeError(f"{name} has dtype {jnp.result_type(x)} but q has {dtype}; q, k and v must share one dtype")
    qs, ks, vs = jnp.shape(q), jnp.shape(k), jnp.shape(v)
    if ks != vs:
        raise ValueError(f"v has shape {vs} but k has {ks}; they must match")
    if ks[0] != qs[0] or ks[3] != qs[3]:
        raise ValueError(f"k has shape {ks}; its batch and head_dim must match q's {qs}")
    if qs[3] < 1:
        raise ValueError(f"q has head_dim 0 (shape {qs}); head_dim must be >= 1")
    if (ks[2] == 0 and qs[2] > 0) or (ks[2] > 0 and qs[2] % ks[2] != 0):
        raise ValueError(
            f"q's heads ({qs[2]}) must be a multiple of k's heads_kv ({ks[2]}) for grouped-query attention")


@functools.partial(jax.jit, static_argnames=("causal", "softmax_scale", "backend"))
def _attention_call(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool, softmax_scale: float,
                    backend: str) -> tuple[jax.Array, jax.Array]:
    batch, seqlen_q, heads, _ = q.shape
    call = jax.ffi.ffi_call(
        TARGET_NAME,
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, seqlen_q), jnp.float32)),
        # vmap prepends the mapped axis to every operand and result; the handlers fold all
        # leading axes into batch. Unmapped operands (e.g. shared k, v) are broadcast first.
        vmap_method="broadcast_all",
    )
    return call(q, k, v, causal=np.bool_(causal), softmax_scale=np.float64(softmax_scale), backend=backend)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _attention_differentiable(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, softmax_scale: float,
                              backend: str) -> tuple[jax.Array, jax.Array]:
    return _attention_call(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend)


def _attention_fwd(q, k, v, causal, softmax_scale, backend):
    out, lse = _attention_call(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend)
    return (out, lse), (q, k, v, out, lse)


def _attention_bwd(causal, softmax_scale, backend, residuals, cotangents):
    q, k, v, out, lse = residuals
    dout, dlse = cotangents
    # A forward-only backend named for the forward computes the gradient on the automatic choice.
    if not _waveboost.backend_has_backward(backend):
        backend = "auto"
    return _attention_backward_call(dout.astype(q.dtype), q, k, v, out, lse, dlse.astype(jnp.float32),
                                    causal=causal, softmax_scale=softmax_scale, has_dlse=True, deterministic=False,
                                    backend=backend)


_attention_differentiable.defvjp(_attention_fwd, _attention_bwd)


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    backend: str = "auto",
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """``waveboost.attention`` for JAX: an XLA custom call, usable under ``jit`` and ``vmap``.

    Same arguments and conventions as ``waveboost.attention`` (BSHD layout, GQA/MQA, bottom-right
    causal mask, float32 ``lse`` of shape (batch, heads, seqlen_q)) less ``out=``: XLA allocates
    the results. ``causal``, ``softmax_scale`` and ``backend`` are static (Python values, not
    traced arrays). An explicit ``backend`` that cannot run the call fails when XLA executes it,
    with waveboost's message.
    """
    _require_ffi((q, k, v))
    _check_inputs(q, k, v, backend)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(jnp.shape(q)[3])
    softmax_scale = float(softmax_scale)
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be a finite number; got {softmax_scale}")
    _registered_backward_platforms()
    out, lse = _attention_differentiable(q, k, v, bool(causal), softmax_scale, backend)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------

#: The XLA custom-call target of the backward handlers, for both platforms.
BACKWARD_TARGET_NAME = "waveboost_attention_backward"

_BACKWARD_HANDLER_SYMBOLS = {"cpu": "waveboost_jax_attention_backward_cpu",
                             "CUDA": "waveboost_jax_attention_backward_cuda"}


@functools.cache
def _registered_backward_platforms() -> tuple[str, ...]:
    """Registers the backward handlers this build has with XLA (once) and returns their platforms."""
    library = ctypes.CDLL(_waveboost.__file__)
    platforms = []
    for platform, symbol in _BACKWARD_HANDLER_SYMBOLS.items():
        handler = getattr(library, symbol, None)
        if handler is not None:
            jax.ffi.register_ffi_target(BACKWARD_TARGET_NAME, jax.ffi.pycapsule(handler), platform=platform)
            platforms.append(platform)
    return tuple(platforms)


@functools.partial(jax.jit, static_argnames=("causal", "softmax_scale", "has_dlse", "deterministic", "backend"))
def _attention_backward_call(dout: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, out: jax.Array,
                             lse: jax.Array, dlse: jax.Array, *, causal: bool, softmax_scale: float, has_dlse: bool,
                             deterministic: bool, backend: str) -> tuple[jax.Array, jax.Array, jax.Array]:
    call = jax.ffi.ffi_call(
        BACKWARD_TARGET_NAME,
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
         jax.ShapeDtypeStruct(v.shape, v.dtype)),
        vmap_method="broadcast_all",  # leading axes fold into batch, as in the forward
    )
    return call(dout, q, k, v, out, lse, dlse, causal=np.bool_(causal), softmax_scale=np.float64(softmax_scale),
                has_dlse=np.bool_(has_dlse), deterministic=np.bool_(deterministic), backend=backend)


def attention_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    dlse: Any = None,
    deterministic: bool = False,
    backend: str = "auto",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``waveboost.attention_backward`` for JAX: an XLA custom call, usable under ``jit`` and ``vmap``.

    Returns ``(dq, dk, dv)`` allocated by XLA. ``out`` and ``lse`` are those of the forward call
    with the same ``causal`` and ``softmax_scale``; ``dlse`` (float32, lse's shape) is optional.
    """
    _require_ffi((dout, q, k, v, out, lse))
    if not _registered_backward_platforms():
        raise RuntimeError("this build of waveboost has XLA FFI handlers for the forward pass only; rebuild it")
    _check_inputs(q, k, v, backend)
    if not _waveboost.backend_has_backward(backend):
        from ._api import backward_backends

        raise ValueError(f"backend {backend!r} is forward-only: it has no backward pass; "
                         f"the backends with one are {backward_backends()}")
    dtype = jnp.result_type(q)
    for name, x in (("dout", dout), ("out", out)):
        if jnp.shape(x) != jnp.shape(q):
            raise ValueError(f"{name} has shape {jnp.shape(x)} but q has shape {jnp.shape(q)}; they must match")
        if jnp.result_type(x) != dtype:
            raise TypeError(f"{name} has dtype {jnp.result_type(x)} but q has {dtype}; they must match")
    qs = jnp.shape(q)
    lse_shape = (qs[0], qs[2], qs[1])
    for name, x in (("lse", lse), ("dlse", dlse)):
        if x is None:
            continue
        if jnp.shape(x) != lse_shape:
            raise ValueError(f"{name} has shape {jnp.shape(x)} but must be (batch, heads, seqlen_q) = {lse_shape}")
        if jnp.result_type(x) != jnp.float32:
            raise TypeError(f"{name} must have dtype float32; got {jnp.result_type(x)}")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(qs[3])
    softmax_scale = float(softmax_scale)
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be a finite number; got {softmax_scale}")
    has_dlse = dlse is not None
    return _attention_backward_call(dout, q, k, v, out, lse, dlse if has_dlse else lse, causal=bool(causal),
                                    softmax_scale=softmax_scale, has_dlse=has_dlse,
                                    deterministic=bool(deterministic), backend=backend)


# Context parallelism inside jax.shard_map (python/waveboost/_jax_ring.py).
from ._jax_ring import ring_attention, shard_sequence, unshard_sequence  # noqa: E402
