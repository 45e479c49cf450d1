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

float8_e4m3fn q, k, v (Hopper's ``wgmma`` forward) go through the same custom call, with their
descale factors as operands; they have no backward, and ``jax.grad`` through them raises.
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
from ._api import (BACKENDS, DESCALE_NAMES, _max_length, check_backend, check_descale, check_flag, check_fp8,
                   check_softmax_scale, fp8_no_backward, map_descales, varlen_args, varlen_max_lengths)

__all__ = ["BACKWARD_TARGET_NAME", "KVCACHE_TARGET_NAME", "MERGE_TARGET_NAME", "TARGET_NAME", "VARLEN_TARGET_NAME",
           "attention", "attention_backward", "attention_varlen", "attention_with_kvcache", "ffi_available",
           "kvcache_ffi_available", "merge_attention_states", "merge_ffi_available", "ring_attention",
           "shard_sequence", "unshard_sequence", "varlen_ffi_available"]

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


def _static_scale(softmax_scale: Any, head_dim: int) -> float:
    """softmax_scale checked as waveboost.attention checks it, None as 1 / sqrt(head_dim): a static
    attribute of the custom call."""
    scale = check_softmax_scale(softmax_scale)
    return 1.0 / math.sqrt(head_dim) if scale is None else scale


def _check_inputs(q: Any, k: Any, v: Any, backend: str, fp8: bool = False) -> None:
    """Trace-time checks, so mistakes raise here with a message instead of inside XLA. With `fp8`
    (see check_fp8), q, k and v are float8_e4m3fn."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    for name, x, layout in (("q", q, "(batch, seqlen_q, heads, head_dim)"),
                            ("k", k, "(batch, seqlen_k, heads_kv, head_dim)"),
                            ("v", v, "(batch, seqlen_k, heads_kv, head_dim)")):
        if jnp.ndim(x) != 4:
            raise ValueError(f"{name} must be a 4-D array {layout}; got shape {jnp.shape(x)}")
    dtype = jnp.result_type(q)
    if dtype not in _SUPPORTED_DTYPES and not fp8:
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
def _attention_call(q: jax.Array, k: jax.Array, v: jax.Array, q_descale: jax.Array | None, k_descale: jax.Array | None,
                    v_descale: jax.Array | None, *, causal: bool, softmax_scale: float,
                    backend: str) -> tuple[jax.Array, jax.Array]:
    batch, seqlen_q, heads, _ = q.shape
    out_dtype = jnp.bfloat16 if q.dtype == jnp.float8_e4m3fn else q.dtype
    call = jax.ffi.ffi_call(
        TARGET_NAME,
        (jax.ShapeDtypeStruct(q.shape, out_dtype), jax.ShapeDtypeStruct((batch, heads, seqlen_q), jnp.float32)),
        # vmap prepends the mapped axis to every operand and result; the handlers fold all
        # leading axes into batch. Unmapped operands (e.g. shared k, v) are broadcast first.
        vmap_method="broadcast_all",
    )
    absent = jnp.zeros((0,), jnp.float32)  # the operand of a descale not given (has_*_descale false)
    descales = (q_descale, k_descale, v_descale)
    return call(q, k, v, *(absent if d is None else d for d in descales), causal=np.bool_(causal),
                softmax_scale=np.float64(softmax_scale), backend=backend,
                **{f"has_{name}": np.bool_(d is not None) for name, d in zip(DESCALE_NAMES, descales)})


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _attention_differentiable(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, softmax_scale: float,
                              backend: str) -> tuple[jax.Array, jax.Array]:
    return _attention_call(q, k, v, None, None, None, causal=causal, softmax_scale=softmax_scale, backend=backend)


def _attention_fwd(q, k, v, causal, softmax_scale, backend):
    out, lse = _attention_call(q, k, v, None, None, None, causal=causal, softmax_scale=softmax_scale,
                               backend=backend)
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


# FP8 has no backward: differentiating through the call (with respect to q, k, v, the descales or
# anything they come from) raises, rather than JAX's generic "no differentiation rule".
@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _attention_fp8(q: jax.Array, k: jax.Array, v: jax.Array, q_descale: jax.Array | None,
                   k_descale: jax.Array | None, v_descale: jax.Array | None, causal: bool, softmax_scale: float,
                   backend: str) -> tuple[jax.Array, jax.Array]:
    return _attention_call(q, k, v, q_descale, k_descale, v_descale, causal=causal, softmax_scale=softmax_scale,
                           backend=backend)


def _attention_fp8_fwd(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, backend):
    return _attention_call(q, k, v, q_descale, k_descale, v_descale, causal=causal, softmax_scale=softmax_scale,
                           backend=backend), None


def _attention_fp8_bwd(causal, softmax_scale, backend, residuals, cotangents):
    raise NotImplementedError(fp8_no_backward(
        "jax.grad and jax.vjp cannot differentiate waveboost.jax.attention on float8_e4m3fn inputs; apply "
        "jax.lax.stop_gradient to its inputs if no gradient should flow through it"))


_attention_fp8.defvjp(_attention_fp8_fwd, _attention_fp8_bwd)


def _descale_operand(d: Any, arg: str, q: Any, batch: int, heads_kv: int) -> jax.Array:
    """A descale factor as the float32 (batch, heads_kv) operand of the custom call (under jit too:
    a Python float becomes a constant array, an array of one element is broadcast)."""
    if check_descale(d, arg, "jax", batch, heads_kv):
        d = jnp.asarray(d, jnp.float32)
    elif all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) for x in (d, q)) and \
            d.devices() != q.devices():
        raise ValueError(f"{arg} is on {sorted(str(x) for x in d.devices())} but q is on "
                         f"{sorted(str(x) for x in q.devices())}; all arrays must be on one device")
    return jnp.broadcast_to(jnp.reshape(d, (1, 1)) if jnp.shape(d) != (batch, heads_kv) else d, (batch, heads_kv))


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    backend: str = "auto",
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """``waveboost.attention`` for JAX: an XLA custom call, usable under ``jit`` and ``vmap``.

    Same arguments and conventions as ``waveboost.attention`` (BSHD layout, GQA/MQA, bottom-right
    causal mask, float32 ``lse`` of shape (batch, heads, seqlen_q)) less ``out=``: XLA allocates
    the results. ``causal``, ``softmax_scale`` and ``backend`` are static (Python values, not
    traced arrays). An explicit ``backend`` that cannot run the call fails when XLA executes it,
    with waveboost's message.

    FP8: q, k and v may be ``float8_e4m3fn`` (backend ``"wgmma"`` or ``"auto"``; Hopper, head dim
    128), with ``q_descale``, ``k_descale`` and ``v_descale`` as in ``waveboost.attention``: a
    float, or a float32 array of shape (batch, heads_kv) or of one element (traced arrays too).
    ``out`` is then bfloat16. FP8 has no backward: ``jax.grad`` through such a call raises
    ``NotImplementedError``.
    """
    _require_ffi((q, k, v))
    descales = (q_descale, k_descale, v_descale)
    fp8 = check_fp8(q, check_backend(backend), descales)
    _check_inputs(q, k, v, backend, fp8)
    softmax_scale = _static_scale(softmax_scale, jnp.shape(q)[3])
    causal = check_flag(causal, "causal")
    if fp8:
        descales = map_descales(descales, q, k, lambda d, arg, batch, heads_kv: _descale_operand(
            d, arg, q, batch, heads_kv))
        out, lse = _attention_fp8(q, k, v, *descales, causal, softmax_scale, backend)
    else:
        _registered_backward_platforms()
        out, lse = _attention_differentiable(q, k, v, causal, softmax_scale, backend)
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
    softmax_scale = _static_scale(softmax_scale, qs[3])
    has_dlse = dlse is not None
    return _attention_backward_call(dout, q, k, v, out, lse, dlse if has_dlse else lse, causal=bool(causal),
                                    softmax_scale=softmax_scale, has_dlse=has_dlse,
                                    deterministic=bool(deterministic), backend=backend)



# ---------------------------------------------------------------------------
# Serving: attention against a KV cache, with the cache update returned (and done in place under
# jit when the caches are donated).
# ---------------------------------------------------------------------------

#: The custom-call target of the KV-cache handlers.
KVCACHE_TARGET_NAME = "waveboost_attention_with_kvcache"
_KVCACHE_SYMBOLS = {"cpu": "waveboost_jax_kvcache_cpu", "CUDA": "waveboost_jax_kvcache_cuda"}


@functools.cache
def _kvcache_platforms() -> tuple[str, ...]:
    library = ctypes.CDLL(_waveboost.__file__)
    platforms = []
    for platform, symbol in _KVCACHE_SYMBOLS.items():
        handler = getattr(library, symbol, None)
        if handler is not None:
            jax.ffi.register_ffi_target(KVCACHE_TARGET_NAME, jax.ffi.pycapsule(handler), platform=platform)
            platforms.append(platform)
    return tuple(platforms)


def kvcache_ffi_available() -> bool:
    """Whether this build carries the XLA FFI handlers of ``attention_with_kvcache``."""
    return "cpu" in _kvcache_platforms()


@functools.partial(jax.jit, static_argnames=("causal", "softmax_scale", "backend", "paged", "append"))
def _kvcache_call(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, *, causal, softmax_scale, backend,
                  paged, append):
    batch, seqlen_q, heads, _ = q.shape
    call = jax.ffi.ffi_call(
        KVCACHE_TARGET_NAME,
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, seqlen_q), jnp.float32),
         jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype), jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype),
         jax.ShapeDtypeStruct((batch,), jnp.int32)),
        input_output_aliases={1: 2, 2: 3},  # the caches are updated in their own buffers
    )
    return call(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal=np.bool_(causal),
                softmax_scale=np.float64(softmax_scale), backend=backend, paged=np.bool_(paged),
                append=np.bool_(append))


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
    softmax_scale: float | None = None,
    return_lse: bool = False,
    backend: str = "auto",
) -> Any:
    """``waveboost.attention_with_kvcache`` for JAX, as an XLA custom call (usable under ``jit``).

    Same arguments and conventions as ``waveboost.attention_with_kvcache`` less ``out=`` and
    ``validate=``. With ``k_new``/``v_new`` the result is ``(out, k_cache, v_cache)`` (or
    ``(out, lse, k_cache, v_cache)``): the caches with the new rows written at each sequence's end.
    The custom call's cache results alias its cache operands, so inside a ``jax.jit`` whose caches
    are donated (``donate_argnums``) XLA writes the new rows into the existing buffers; without
    donation XLA first copies each cache. Nothing is read on the host. ``causal``,
    ``softmax_scale`` and ``backend`` are static. Not batched by ``vmap``.
    """
    if not _kvcache_platforms():
        _require_ffi(())
    if "CUDA" not in _kvcache_platforms():
        _require_ffi((q, k_cache, v_cache))
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new go together: give both or neither")
    qs, cs = jnp.shape(q), jnp.shape(k_cache)
    if len(qs) != 4:
        raise ValueError(f"q must be a 4-D array (batch, seqlen_q, heads, head_dim); got shape {qs}")
    if len(cs) != 4 or jnp.shape(v_cache) != cs:
        raise ValueError(f"k_cache and v_cache must be 4-D arrays of one shape; got {cs} and {jnp.shape(v_cache)}")
    dtype = jnp.result_type(q)
    if dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"q must have dtype float16, bfloat16, float32 or float64; got {dtype}")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new)):
        if x is not None and jnp.result_type(x) != dtype:
            raise TypeError(f"{name} has dtype {jnp.result_type(x)} but q has {dtype}; they must share one dtype")
    for name, x in (("cache_seqlens", cache_seqlens), ("block_table", block_table)):
        if x is not None and jnp.result_type(x) != jnp.int32:
            raise TypeError(f"{name} must have dtype int32; got {jnp.result_type(x)}")
    if jnp.shape(cache_seqlens) != (qs[0],):
        raise ValueError(f"cache_seqlens must have shape (batch,) = ({qs[0]},); got {jnp.shape(cache_seqlens)}")
    paged = block_table is not None
    if paged and (jnp.ndim(block_table) != 2 or jnp.shape(block_table)[0] != qs[0]):
        raise ValueError(f"block_table must have shape (batch, max_pages) with batch {qs[0]}; "
                         f"got {jnp.shape(block_table)}")
    if not paged and cs[0] != qs[0]:
        raise ValueError(f"k_cache has batch {cs[0]} but q has {qs[0]}")
    if paged and cs[1] < 1:
        raise ValueError(f"page_size must be >= 1; k_cache has shape {cs}")
    if cs[3] != qs[3] or cs[2] == 0 or qs[2] % cs[2] != 0:
        raise ValueError(f"k_cache {cs} must have q's head_dim and a heads_kv dividing q's heads; q is {qs}")
    append = k_new is not None
    if append:
        ns = jnp.shape(k_new)
        if len(ns) != 4 or jnp.shape(v_new) != ns or ns[0] != qs[0] or ns[2:] != cs[2:]:
            raise ValueError(f"k_new and v_new must be (batch, seqlen_new, heads_kv, head_dim) = ({qs[0]}, *, "
                             f"{cs[2]}, {cs[3]}); got {ns} and {jnp.shape(v_new)}")
    else:
        k_new = v_new = jnp.zeros((qs[0], 0, cs[2], cs[3]), dtype)
    if not paged:
        block_table = jnp.zeros((qs[0], 0), jnp.int32)
    softmax_scale = _static_scale(softmax_scale, qs[3])
    out, lse, k_cache, v_cache, _ = _kvcache_call(
        q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal=bool(causal),
        softmax_scale=softmax_scale, backend=backend, paged=paged, append=append)
    result = (out, lse) if return_lse else (out,)
    if append:
        return result + (k_cache, v_cache)
    return result if return_lse else out


# ---------------------------------------------------------------------------
# Serving: variable-length batches (packed, or over a paged cache).
# ---------------------------------------------------------------------------

#: The custom-call target of the variable-length handlers.
VARLEN_TARGET_NAME = "waveboost_attention_varlen"
_VARLEN_SYMBOLS = {"cpu": "waveboost_jax_varlen_cpu", "CUDA": "waveboost_jax_varlen_cuda"}


@functools.cache
def _varlen_platforms() -> tuple[str, ...]:
    library = ctypes.CDLL(_waveboost.__file__)
    platforms = []
    for platform, symbol in _VARLEN_SYMBOLS.items():
        handler = getattr(library, symbol, None)
        if handler is not None:
            jax.ffi.register_ffi_target(VARLEN_TARGET_NAME, jax.ffi.pycapsule(handler), platform=platform)
            platforms.append(platform)
    return tuple(platforms)


def varlen_ffi_available() -> bool:
    """Whether this build carries the XLA FFI handlers of ``attention_varlen``."""
    return "cpu" in _varlen_platforms()


@functools.partial(jax.jit, static_argnames=("max_seqlen_q", "max_seqlen_k", "causal", "softmax_scale", "backend",
                                             "paged", "has_seqused"))
def _varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, *, max_seqlen_q, max_seqlen_k, causal,
                 softmax_scale, backend, paged, has_seqused):
    total_q, heads, _ = q.shape
    call = jax.ffi.ffi_call(
        VARLEN_TARGET_NAME,
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((heads, total_q), jnp.float32)),
    )
    return call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q=np.int64(max_seqlen_q),
                max_seqlen_k=np.int64(max_seqlen_k), causal=np.bool_(causal),
                softmax_scale=np.float64(softmax_scale), backend=backend, paged=np.bool_(paged),
                has_seqused=np.bool_(has_seqused))


def _host_max_length(cu_seqlens: Any, name: str) -> int:
    if isinstance(cu_seqlens, jax.core.Tracer):
        raise ValueError(f"max_seqlen_{name[-1]} is required under jit (it sizes the launch and cannot be read from "
                         f"the traced {name})")
    return _max_length(cu_seqlens, name)


def attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    block_table: Any = None,
    seqused_k: Any = None,
    return_lse: bool = False,
    backend: str = "auto",
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """``waveboost.attention_varlen`` for JAX, as an XLA custom call (usable under ``jit``).

    Same arguments and conventions as ``waveboost.attention_varlen`` less ``out=`` and
    ``validate=``. ``max_seqlen_q``, ``max_seqlen_k``, ``causal``, ``softmax_scale`` and ``backend``
    are static; under ``jit`` the ``max_seqlen_*`` bounds must be given (outside it, omitted ones are
    read from the concrete cu_seqlens on the host). Not batched by ``vmap``.
    """
    if not _varlen_platforms():
        _require_ffi(())
    if "CUDA" not in _varlen_platforms():
        _require_ffi((q, k, v))
    qs = jnp.shape(q)
    cu_seqlens_k, seqused_k = varlen_args(qs, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q,
                                          max_seqlen_k)
    dtype = jnp.result_type(q)
    if dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"q must have dtype float16, bfloat16, float32 or float64; got {dtype}")
    for name, x in (("k", k), ("v", v)):
        if jnp.result_type(x) != dtype:
            raise TypeError(f"{name} has dtype {jnp.result_type(x)} but q has {dtype}; they must share one dtype")
    paged = block_table is not None
    for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k),
                    ("block_table", block_table)):
        if x is not None and jnp.result_type(x) != jnp.int32:
            raise TypeError(f"{name} must have dtype int32; got {jnp.result_type(x)}")
    if jnp.ndim(cu_seqlens_q) != 1 or jnp.shape(cu_seqlens_q)[0] < 1:
        raise ValueError(f"cu_seqlens_q must have shape (batch + 1,); got {jnp.shape(cu_seqlens_q)}")
    batch = jnp.shape(cu_seqlens_q)[0] - 1
    if cu_seqlens_k is not None and jnp.shape(cu_seqlens_k) != (batch + 1,):
        raise ValueError(f"cu_seqlens_k must have shape (batch + 1,) = ({batch + 1},); got {jnp.shape(cu_seqlens_k)}")
    if seqused_k is not None and jnp.shape(seqused_k) != (batch,):
        raise ValueError(f"seqused_k must have shape (batch,) = ({batch},); got {jnp.shape(seqused_k)}")
    if paged and (jnp.ndim(block_table) != 2 or jnp.shape(block_table)[0] != batch):
        raise ValueError(f"block_table must have shape (batch, max_pages) with batch {batch}; "
                         f"got {jnp.shape(block_table)}")
    ks = jnp.shape(k)
    if len(ks) != (4 if paged else 3) or jnp.shape(v) != ks or ks[-1] != qs[2]:
        layout = "(num_pages, page_size, heads_kv, head_dim)" if paged else "(total_k, heads_kv, head_dim)"
        raise ValueError(f"k and v must be {layout} with q's head_dim; got {ks} and {jnp.shape(v)}")
    if paged and ks[1] < 1:
        raise ValueError(f"page_size must be >= 1; k has shape {ks}")
    if ks[-2] == 0 or qs[1] % ks[-2] != 0:
        raise ValueError(f"q's heads ({qs[1]}) must be a multiple of k's heads_kv ({ks[-2]})")
    max_seqlen_q, max_seqlen_k = varlen_max_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                    _host_max_length)
    softmax_scale = _static_scale(softmax_scale, qs[2])
    empty = jnp.zeros((0,), jnp.int32)
    out, lse = _varlen_call(
        q, k, v, cu_seqlens_q, empty if cu_seqlens_k is None else cu_seqlens_k,
        empty if seqused_k is None else seqused_k, block_table if paged else jnp.zeros((0, 0), jnp.int32),
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=bool(causal),
        softmax_scale=softmax_scale, backend=backend, paged=paged, has_seqused=seqused_k is not None)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------
# Serving: merging partial attention states.
# ---------------------------------------------------------------------------

#: The custom-call target of the merge handlers.
MERGE_TARGET_NAME = "waveboost_merge_attention_states"
_MERGE_SYMBOLS = {"cpu": "waveboost_jax_merge_cpu", "CUDA": "waveboost_jax_merge_cuda"}


@functools.cache
def _merge_platforms() -> tuple[str, ...]:
    library = ctypes.CDLL(_waveboost.__file__)
    platforms = []
    for platform, symbol in _MERGE_SYMBOLS.items():
        handler = getattr(library, symbol, None)
        if handler is not None:
            jax.ffi.register_ffi_target(MERGE_TARGET_NAME, jax.ffi.pycapsule(handler), platform=platform)
            platforms.append(platform)
    return tuple(platforms)


def merge_ffi_available() -> bool:
    """Whether this build carries the XLA FFI handlers of ``merge_attention_states``."""
    return "cpu" in _merge_platforms()


@jax.jit
def _merge_call(outs, lses):
    _, batch, seqlen, heads, _ = outs.shape
    call = jax.ffi.ffi_call(
        MERGE_TARGET_NAME,
        (jax.ShapeDtypeStruct(outs.shape[1:], outs.dtype), jax.ShapeDtypeStruct((batch, heads, seqlen), jnp.float32)),
    )
    return call(outs, lses)


def merge_attention_states(outs: Any, lses: Any, *, return_lse: bool = True) -> Any:
    """``waveboost.merge_attention_states`` for JAX, as an XLA custom call (usable under ``jit``).

    ``outs`` (num_parts, batch, seqlen, heads, head_dim) or a sequence of (batch, seqlen, heads,
    head_dim) arrays; ``lses`` float32 (num_parts, batch, heads, seqlen) or a sequence of
    (batch, heads, seqlen). The merged output has outs' dtype.
    """
    if not _merge_platforms():
        _require_ffi(())
    if isinstance(outs, (list, tuple)):
        if not outs:
            raise ValueError("outs must hold at least one part; got an empty sequence")
        outs = jnp.stack(outs)
    if isinstance(lses, (list, tuple)):
        lses = jnp.stack(lses)
    if "CUDA" not in _merge_platforms():
        _require_ffi((outs, lses))
    os_, ls = jnp.shape(outs), jnp.shape(lses)
    if len(os_) != 5:
        raise ValueError(f"outs must be (num_parts, batch, seqlen, heads, head_dim); got shape {os_}")
    if jnp.result_type(outs) not in _SUPPORTED_DTYPES:
        raise TypeError(f"outs must have dtype float16, bfloat16, float32 or float64; got {jnp.result_type(outs)}")
    if jnp.result_type(lses) != jnp.float32:
        raise TypeError(f"lses must have dtype float32; got {jnp.result_type(lses)}")
    if ls != (os_[0], os_[1], os_[3], os_[2]):
        raise ValueError(f"lses must have shape (num_parts, batch, heads, seqlen) = {(os_[0], os_[1], os_[3], os_[2])}; "
                         f"got {ls}")
    out, lse = _merge_call(outs, lses)
    return (out, lse) if return_lse else out


# Context parallelism inside jax.shard_map (python/waveboost/_jax_ring.py).
from ._jax_ring import ring_attention, shard_sequence, unshard_sequence  # noqa: E402
