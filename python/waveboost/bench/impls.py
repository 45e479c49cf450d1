"""The implementations a run compares: a registry of small adapters.

Each adapter is a context manager `prepare(case, inputs)` that turns the shared BSHD inputs
(NumPy arrays on the CPU, torch tensors on CUDA) into what its framework wants, outside the
timed region, and yields a `Prepared` whose `run()` is the timed call. `missing()` says why an
implementation cannot run here ("torch not installed"), or None.
"""

from __future__ import annotations

import functools
import importlib
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

# waveboost's CUDA backends, as its compiled module names them; missing() says which cannot run here.
WAVEBOOST_CUDA_BACKENDS = tuple(b for b in importlib.import_module("waveboost").BACKENDS if b not in ("auto", "cpu"))
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
                 "sdpa_eff": "EFFICIENT_ATTENTION", "sdpa_math": "MATH"}


@dataclass
class Prepared:
    """What the measurement needs from an adapter.

    run: the timed call; returns the output.
    to_bshd: raw output -> BSHD array in the reference's framework (NumPy on CPU, torch on CUDA).
    clock: "cuda-event" (timed on torch's current stream) or "host" (perf_counter around run + wait).
    wait: blocks until an output is computed (JAX dispatches asynchronously).
    memory: optional own measurement of extra memory -> (bytes, method).
    """

    run: Callable[[], Any]
    to_bshd: Callable[[Any], Any] = lambda out: out
    clock: str = "host"
    wait: Callable[[Any], None] = lambda out: None
    memory: Callable[[], tuple] | None = None


@dataclass
class Impl:
    """name: unique within a device's registry; kind: "waveboost" or "peer" (charts style them apart);
    score_bytes: bytes per element of the B*H*L*L score matrix when the implementation
    materializes it (0 if not): used to skip cells that would not fit."""

    name: str
    prepare: Callable
    missing: Callable[[], str | None]
    kind: str = "peer"
    score_bytes: float = 0.0


@functools.cache
def module(name: str):
    """The imported module, or None when it is not installed."""
    if name == "jax":
        # XLA otherwise reserves 75% of GPU memory at start-up and torch runs out.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _needs(*names) -> Callable[[], str | None]:
    def missing():
        for name in names:
            if module(name) is None:
                return f"{name} not installed"
        return None
    return missing


def _waveboost_missing(backend: str, device: str) -> Callable[[], str | None]:
    def missing():
        if device == "cuda" and module("torch") is None:
            return "torch not installed (CUDA inputs are torch tensors)"
        wb = module("waveboost")
        if wb is None or not hasattr(wb, "info"):
            return "waveboost not installed"
        info = wb.info()
        if backend not in info.get("backends", ()):
            if device == "cuda" and not info.get("cuda_compiled"):
                return "waveboost built without CUDA"
            return f"backend {backend!r} not in waveboost.info()['backends']"
        return None
    return missing


def _jax_missing(device: str) -> Callable[[], str | None]:
    def missing():
        reason = _needs("jax", "torch")() if device == "cuda" else _needs("jax")()
        if reason is None and device == "cuda" and module("jax").default_backend() != "gpu":
            return "jax has no GPU backend (pip install 'jax[cuda13]')"
        return reason
    return missing


# ---- adapters -------------------------------------------------------------------------------

def _waveboost(backend: str, clock: str):
    @contextmanager
    def prepare(case, x):
        wb = module("waveboost")
        yield Prepared(run=lambda: wb.attention(x.q, x.k, x.v, causal=case.causal, backend=backend),
                       clock=clock)
    return prepare


def _sdpa(backend: str | None):
    """torch SDPA on (B, H, L, D) views of the BSHD storage; `backend` forces one kernel."""
    @contextmanager
    def prepare(case, x):
        torch = module("torch")
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q, k, v = (torch.from_numpy(t) if isinstance(t, np.ndarray) else t for t in (x.q, x.k, x.v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        kwargs = {"is_causal": case.causal}
        if case.kv_heads != case.heads:
            kwargs["enable_gqa"] = True  # without it GQA/MQA shapes fail (the old study's bug)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        on_cpu = isinstance(x.q, np.ndarray)
        to_bshd = (lambda o: o.transpose(1, 2).numpy()) if on_cpu else (lambda o: o.transpose(1, 2))
        prepared = Prepared(run=lambda: sdpa(q, k, v, **kwargs), to_bshd=to_bshd,
                            clock="host" if on_cpu else "cuda-event")
        if backend is None:
            yield prepared
        else:
            # Entered once around all calls, so its cost stays out of the timed calls.
            with sdpa_kernel(getattr(SDPBackend, backend)):
                yield prepared
    return prepare


def _jax(implementation: str):
    @contextmanager
    def prepare(case, x):
        jax = module("jax")
        on_cpu = isinstance(x.q, np.ndarray)
        if on_cpu:
            q, k, v = (jax.numpy.asarray(t) for t in (x.q, x.k, x.v))
        else:
            q, k, v = (jax.dlpack.from_dlpack(t) for t in (x.q, x.k, x.v))
        fn = jax.jit(functools.partial(jax.nn.dot_product_attention, is_causal=case.causal,
                                       implementation=implementation))

        def memory():
            analysis = fn.lower(q, k, v).compile().memory_analysis()
            return analysis.temp_size_in_bytes + analysis.output_size_in_bytes, "xla-memory-analysis"

        if on_cpu:
            to_bshd = np.asarray
        else:
            torch = module("torch")
            to_bshd = torch.from_dlpack
        # float32 matmuls default to TF32 on NVIDIA GPUs in XLA; ask for true fp32 like the other peers.
        precision = "highest" if case.dtype == "float32" else None
        with jax.default_matmul_precision(precision):
            yield Prepared(run=lambda: fn(q, k, v), to_bshd=to_bshd, clock="host",
                           wait=lambda out: out.block_until_ready(),
                           memory=None if on_cpu else memory)
    return prepare


@contextmanager
def _numpy_prepare(case, x):
    """softmax(Q K^T) V in the inputs' dtype, the scores materialized (the original baseline).

    Queries are grouped per kv head, (B, Hkv, G, L, D), so GQA needs no copies of K and V."""
    b, seqlen, h, d = x.q.shape
    g = h // case.kv_heads
    q = np.ascontiguousarray(x.q.reshape(b, seqlen, case.kv_heads, g, d).transpose(0, 2, 3, 1, 4))
    kt = np.ascontiguousarray(x.k.transpose(0, 2, 3, 1))[:, :, None]  # (B, Hkv, 1, D, L)
    v = np.ascontiguousarray(x.v.transpose(0, 2, 1, 3))[:, :, None]  # (B, Hkv, 1, L, D)
    scale = x.q.dtype.type(1.0 / np.sqrt(d))
    # Adding a 0/-inf matrix is ~10x faster than assigning -inf through a boolean index.
    mask = np.triu(np.full((seqlen, seqlen), -np.inf, dtype=x.q.dtype), k=1)

    def run():
        s = (q @ kt) * scale
        if case.causal:
            s += mask
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return (s @ v).transpose(0, 3, 1, 2, 4).reshape(b, seqlen, h, d)

    yield Prepared(run=run)


def registry(device: str) -> list[Impl]:
    """All implementations known for `device` ("cpu" or "cuda"), available or not."""
    if device == "cpu":
        return [
            Impl("waveboost_cpu", _waveboost("cpu", "host"), _waveboost_missing("cpu", "cpu"), "waveboost"),
            Impl("torch_sdpa", _sdpa(None), _needs("torch")),
            Impl("jax_xla", _jax("xla"), _jax_missing("cpu"), score_bytes=8),
            Impl("numpy", _numpy_prepare, lambda: None, score_bytes=12),
        ]
    wb = module("waveboost")
    listed = wb.info().get("backends", ()) if hasattr(wb, "info") else ()
    extra = [b for b in listed if b not in WAVEBOOST_CUDA_BACKENDS + ("cpu", "auto")]
    impls = [Impl(f"waveboost_{b}", _waveboost(b, "cuda-event"), _waveboost_missing(b, "cuda"), "waveboost",
                  score_bytes=8 if b == "naive" else 0)  # naive: fp32 scores, then probabilities
             for b in WAVEBOOST_CUDA_BACKENDS + tuple(extra)]
    # sdpa_math keeps fp32 scores, probabilities and casts: 9.7 GB measured for 1.07e9 scores.
    impls += [Impl(name, _sdpa(backend), _needs("torch"), score_bytes=10 if name == "sdpa_math" else 0)
              for name, backend in SDPA_BACKENDS.items()]
    impls += [Impl("jax_cudnn", _jax("cudnn"), _jax_missing("cuda")),
              Impl("jax_xla", _jax("xla"), _jax_missing("cuda"), score_bytes=8)]
    return impls
