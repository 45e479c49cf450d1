"""The implementations a run compares: a registry of small adapters.

Each adapter is a context manager `prepare(case, inputs)` that turns the shared BSHD inputs
(NumPy arrays on the CPU, torch tensors on CUDA) into what its framework wants, outside the
timed region, and yields a `Prepared` whose `run()` is the timed call. `missing()` says why an
implementation cannot run here ("torch not installed"), or None; `applies(case)` whether it
takes part in a cell's pass and layout at all.

Passes: "fwd" runs the forward; "bwd" the backward alone, from forward outputs saved in
`prepare` (waveboost.attention_backward with the forward's out and lse; autograd's backward of
torch SDPA with a fixed output gradient; the function jax.vjp returns, jitted); "fwdbwd" both.
Their `run()` returns the output, the gradients (dq, dk, dv), or both, in that order.
Serving layouts (kvcache, paged, varlen): waveboost takes the cache in that layout; peers that
have no such layout take the dense (batch, longest KV length) cache with each sequence's length.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import time
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
    calls_per_run: attention calls one run() makes (a jitted loop of decode steps); times are per call.
    note: shown beside an ok result (e.g. "dense cache", "kv expanded to 32 heads").
    """

    run: Callable[[], Any]
    to_bshd: Callable[[Any], Any] = lambda out: out
    clock: str = "host"
    wait: Callable[[Any], None] = lambda out: None
    memory: Callable[[], tuple] | None = None
    calls_per_run: int = 1
    note: str = ""


def _forward_dense(case) -> bool:
    return case.pass_name == "fwd" and case.layout == "dense"


@dataclass
class Impl:
    """name: unique within a device's registry; kind: "waveboost" or "peer" (charts style them apart);
    score_bytes: bytes per element of the B*H*L*L score matrix when the implementation
    materializes it (0 if not): used to skip cells that would not fit. applies(case): whether
    it runs the cell's pass and layout (default: the dense forward only)."""

    name: str
    prepare: Callable
    missing: Callable[[], str | None]
    kind: str = "peer"
    score_bytes: float = 0.0
    applies: Callable[[Any], bool] = _forward_dense


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
        if backend == "auto" and device == "cuda" and not (info.get("cuda_compiled") and info.get("gpus")):
            return "waveboost built without CUDA" if not info.get("cuda_compiled") else "no CUDA device visible"
        if backend != "auto" and backend not in info.get("backends", ()):
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


# ---- helpers shared by the adapters ---------------------------------------------------------

L2_BYTES = 50 << 20  # an H100's L2; the jitted decode loops cycle over enough caches to read HBM
DECODE_LOOP_STEPS = 16  # decode steps per jitted program (JAX peers): dispatch cost spread over them


def _is_numpy(x) -> bool:
    return isinstance(x, np.ndarray)


def _empty_like(x):
    return np.empty_like(x) if _is_numpy(x) else x.new_empty(x.shape)


def _int32(values, like):
    """An int32 index array on `like`'s device (NumPy or torch)."""
    if _is_numpy(like):
        return np.asarray(values, dtype=np.int32)
    return module("torch").tensor(list(values), dtype=module("torch").int32, device=like.device)


def paged_cache(k, v, page_size: int, seed: int = 0):
    """(k_pages, v_pages, block_table): the (batch, L, heads_kv, D) caches (NumPy or torch; L a multiple of
    page_size) cut into pages of page_size keys, placed at shuffled page ids (fixed seed)."""
    b, length, hkv, d = k.shape
    per_seq = length // page_size
    perm = np.random.default_rng(seed).permutation(b * per_seq)
    table = perm.reshape(b, per_seq)
    shape = (b * per_seq, page_size, hkv, d)
    if _is_numpy(k):
        index = perm
    else:
        index = module("torch").as_tensor(perm, device=k.device)
    pages = []
    for t in (k, v):
        p = _empty_like(t.reshape(shape))
        p[index] = t.reshape(shape)
        pages.append(p)
    return pages[0], pages[1], _int32(table.ravel().tolist(), k).reshape(b, per_seq)


def _packed(case, x):
    """(q, k, v, cu_seqlens_q, cu_seqlens_k) packed along one axis, sequence b's first kv_lengths[b] keys."""
    lengths = case.kv_lengths
    cat = np.concatenate if _is_numpy(x.k) else module("torch").cat
    k = cat([x.k[b, :n] for b, n in enumerate(lengths)])
    v = cat([x.v[b, :n] for b, n in enumerate(lengths)])
    q = x.q.reshape(case.batch * case.lq, case.heads, case.head_dim)
    cu_q = _int32([b * case.lq for b in range(case.batch + 1)], x.k)
    cu_k = _int32(np.concatenate([[0], np.cumsum(lengths)]).tolist(), x.k)
    return q, k, v, cu_q, cu_k


def _bottom_right_mask(case, xp, device=None):
    """Boolean (batch, 1, Lq, longest Lk) mask, True where a query sees a key: key j < length_b, and
    for causal j <= i + length_b - Lq."""
    lengths = np.asarray(case.kv_lengths)[:, None, None, None]
    i = np.arange(case.lq)[None, None, :, None]
    j = np.arange(case.max_seqlen_k)[None, None, None, :]
    keep = j < lengths
    if case.causal:
        keep = keep & (j <= i + lengths - case.lq)
    return keep if xp is np else xp.as_tensor(keep, device=device)


def _time_once(fn, wait, calls: int = 3) -> float:
    wait(fn())
    start = time.perf_counter()
    for _ in range(calls):
        wait(fn())
    return (time.perf_counter() - start) / calls


# ---- adapters -------------------------------------------------------------------------------

def _waveboost(backend: str, clock: str, deterministic: bool = False):
    @contextmanager
    def prepare(case, x):
        wb = module("waveboost")
        if case.serving:
            yield _waveboost_serving(wb, case, x, backend, clock)
            return
        if case.pass_name == "fwd":
            yield Prepared(run=lambda: wb.attention(x.q, x.k, x.v, causal=case.causal, backend=backend),
                           clock=clock)
            return
        dq, dk, dv = (_empty_like(t) for t in (x.q, x.k, x.v))

        def backward(out, lse):
            return wb.attention_backward(x.dout, x.q, x.k, x.v, out, lse, causal=case.causal, dq=dq, dk=dk, dv=dv,
                                         deterministic=deterministic, backend=backend)

        if case.pass_name == "bwd":
            out, lse = wb.attention(x.q, x.k, x.v, causal=case.causal, return_lse=True, backend=backend)
            yield Prepared(run=lambda: backward(out, lse), clock=clock)
            return

        def forward_backward():
            out, lse = wb.attention(x.q, x.k, x.v, causal=case.causal, return_lse=True, backend=backend)
            return (out,) + tuple(backward(out, lse))
        yield Prepared(run=forward_backward, clock=clock)
    return prepare


def _waveboost_serving(wb, case, x, backend: str, clock: str) -> Prepared:
    """attention_with_kvcache on a contiguous or paged cache, attention_varlen on packed sequences."""
    out = _empty_like(x.q)
    if case.layout == "varlen":
        q, k, v, cu_q, cu_k = _packed(case, x)
        out = _empty_like(q)
        return Prepared(
            run=lambda: wb.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=case.lq, max_seqlen_k=case.max_seqlen_k,
                                            causal=case.causal, out=out, backend=backend),
            to_bshd=lambda o: o.reshape(case.batch, case.lq, case.heads, case.head_dim), clock=clock)
    lengths = _int32(case.kv_lengths, x.k)
    k, v, table = (x.k, x.v, None) if case.layout == "kvcache" else paged_cache(x.k, x.v, case.page_size)
    return Prepared(run=lambda: wb.attention_with_kvcache(x.q, k, v, lengths, block_table=table, causal=case.causal,
                                                          out=out, backend=backend), clock=clock)


def _sdpa(backend: str | None):
    """torch SDPA on (B, H, L, D) views of the BSHD storage; `backend` forces one kernel."""
    @contextmanager
    def prepare(case, x):
        torch = module("torch")
        from torch.nn.attention import SDPBackend, sdpa_kernel
        on_cpu = _is_numpy(x.q)
        tensors = [torch.from_numpy(t) if on_cpu else t for t in (x.q, x.k, x.v, x.dout) if t is not None]
        q, k, v, *dout = (t.transpose(1, 2) for t in tensors)
        kwargs = {"is_causal": case.causal}
        if case.kv_heads != case.heads:
            kwargs["enable_gqa"] = True  # without it GQA/MQA shapes fail (the old study's bug)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        host = (lambda o: o.transpose(1, 2).numpy()) if on_cpu else (lambda o: o.transpose(1, 2))
        clock = "host" if on_cpu else "cuda-event"
        with (sdpa_kernel(getattr(SDPBackend, backend)) if backend else _nothing()):
            # Entered once around all calls, so its cost stays out of the timed calls.
            if case.serving:
                yield _sdpa_serving(case, q, k, v, kwargs, host, clock)
            elif case.pass_name == "fwd":
                yield Prepared(run=lambda: sdpa(q, k, v, **kwargs), to_bshd=host, clock=clock)
            else:
                leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
                grad = dout[0]
                to_bshd = lambda outs: tuple(host(o.detach()) for o in outs)  # noqa: E731
                if case.pass_name == "bwd":
                    out = sdpa(*leaves, **kwargs)
                    yield Prepared(run=lambda: torch.autograd.grad(out, leaves, grad, retain_graph=True),
                                   to_bshd=to_bshd, clock=clock)
                else:
                    def forward_backward():
                        out = sdpa(*leaves, **kwargs)
                        return (out,) + torch.autograd.grad(out, leaves, grad)
                    yield Prepared(run=forward_backward, to_bshd=to_bshd, clock=clock)
    return prepare


@contextmanager
def _nothing():
    yield


def _sdpa_serving(case, q, k, v, kwargs, host, clock) -> Prepared:
    """SDPA on a dense (B, H, L, D) cache: contiguous copies, made once; varlen lengths and a
    bottom-right causal mask through attn_mask; GQA through enable_gqa, else K/V expanded."""
    torch = module("torch")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    k, v = k.contiguous(), v.contiguous()
    kwargs = dict(kwargs, is_causal=False)
    note = "dense cache"
    if case.layout == "varlen":
        kwargs["attn_mask"] = _bottom_right_mask(case, torch, q.device)
        note += " with a length mask"
    elif case.causal and case.lq > 1:
        from torch.nn.attention.bias import causal_lower_right
        kwargs["attn_mask"] = causal_lower_right(case.lq, case.max_seqlen_k)
    try:
        sdpa(q, k, v, **kwargs)
    except RuntimeError:
        if not kwargs.pop("enable_gqa", False):
            raise
        group = case.heads // case.kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        note += f", kv expanded to {case.heads} heads (enable_gqa refused)"
    return Prepared(run=lambda: sdpa(q, k, v, **kwargs), to_bshd=host, clock=clock, note=note)


def _jax_inputs(x):
    jax = module("jax")
    convert = jax.numpy.asarray if _is_numpy(x.q) else jax.dlpack.from_dlpack
    return [None if t is None else convert(t) for t in (x.q, x.k, x.v, x.dout)]


def _jax_to_bshd(on_cpu: bool):
    return np.asarray if on_cpu else module("torch").from_dlpack


def _jax_passes(case, fn, q, k, v, dout, to_bshd, memory=None) -> Prepared:
    """Prepared for fwd, bwd (jax.vjp's backward function, jitted, on residuals saved once) or fwdbwd."""
    jax = module("jax")
    wait = jax.block_until_ready
    if case.pass_name == "fwd":
        step = jax.jit(fn)
        return Prepared(run=lambda: step(q, k, v), to_bshd=to_bshd, wait=wait,
                        memory=memory and (lambda: memory(step, q, k, v)))
    many = lambda outs: tuple(to_bshd(o) for o in outs)  # noqa: E731
    if case.pass_name == "bwd":
        _, backward = jax.vjp(fn, q, k, v)
        apply = jax.jit(lambda f, g: f(g))
        return Prepared(run=lambda: apply(backward, dout), to_bshd=many, wait=wait,
                        memory=memory and (lambda: memory(apply, backward, dout)))

    @jax.jit
    def forward_backward(q, k, v, g):
        out, backward = jax.vjp(fn, q, k, v)
        return (out,) + tuple(backward(g))
    return Prepared(run=lambda: forward_backward(q, k, v, dout), to_bshd=many, wait=wait,
                    memory=memory and (lambda: memory(forward_backward, q, k, v, dout)))


def _xla_memory(compiled_fn, *args):
    analysis = compiled_fn.lower(*args).compile().memory_analysis()
    return analysis.temp_size_in_bytes + analysis.output_size_in_bytes, "xla-memory-analysis"


def _jax_decode_loop(step, q, caches: list, on_gpu: bool):
    """(run, calls): on a GPU, one jitted program of decode steps over distinct copies of the cache
    (enough that they do not fit in L2), each step's output the next step's query so that XLA can
    neither drop nor merge steps, timed per step; on the CPU one plain call."""
    jax = module("jax")
    if not on_gpu:
        single = jax.jit(step)
        return (lambda: single(q, *caches[0])), 1
    rounds = max(1, DECODE_LOOP_STEPS // len(caches))

    @jax.jit
    def program(q, caches):
        for _ in range(rounds):
            for cache in caches:
                q = step(q, *cache)
        return q
    return (lambda: program(q, caches)), rounds * len(caches)


def _cache_copies(case, arrays) -> list:
    """Copies of the cache arrays (a list of tuples) so that together they exceed 3x L2 (at most 8)."""
    jax = module("jax")
    nbytes = case.bytes_moved
    n = max(1, min(8, math.ceil(3 * L2_BYTES / max(nbytes, 1))))
    return [tuple(arrays)] + [tuple(jax.numpy.array(a, copy=True) for a in arrays) for _ in range(n - 1)]


def _jax(implementation: str):
    @contextmanager
    def prepare(case, x):
        jax = module("jax")
        on_cpu = _is_numpy(x.q)
        q, k, v, dout = _jax_inputs(x)
        to_bshd = _jax_to_bshd(on_cpu)
        # float32 matmuls default to TF32 on NVIDIA GPUs in XLA; ask for true fp32 like the other peers.
        precision = "highest" if case.dtype == "float32" else None
        with jax.default_matmul_precision(precision):
            if case.serving:
                yield _jax_serving(case, implementation, q, k, v, to_bshd, on_cpu)
                return
            fn = functools.partial(jax.nn.dot_product_attention, is_causal=case.causal, implementation=implementation)
            yield _jax_passes(case, fn, q, k, v, dout, to_bshd, memory=None if on_cpu else _xla_memory)
    return prepare


def _jax_serving(case, implementation, q, k, v, to_bshd, on_cpu) -> Prepared:
    """jax.nn.dot_product_attention on the dense cache: key_value_seq_lengths for each sequence's
    length; a bottom-right causal mask as a local window reaching Lk - Lq keys ahead."""
    jax = module("jax")
    kwargs = {"implementation": implementation}
    if case.layout == "varlen":
        if case.causal and case.lq > 1:
            raise NotImplementedError("a causal mask aligned bottom-right per sequence of a different length")
        kwargs["key_value_seq_lengths"] = jax.numpy.asarray(case.kv_lengths, dtype=jax.numpy.int32)
    elif case.causal and case.lq > 1:
        kwargs["local_window_size"] = (case.max_seqlen_k, case.max_seqlen_k - case.lq)
    step = functools.partial(jax.nn.dot_product_attention, **kwargs)
    run, calls = _jax_decode_loop(step, q, _cache_copies(case, (k, v)) if not on_cpu else [(k, v)], not on_cpu)
    single = jax.jit(step)
    first = [True]

    def run_checked():  # the first call (the one checked) is a single step; the timed ones the loop
        if first[0]:
            first[0] = False
            return single(q, k, v)
        return run()
    return Prepared(run=run_checked, to_bshd=to_bshd, wait=jax.block_until_ready, calls_per_run=calls,
                    memory=None if on_cpu else (lambda: _xla_memory(single, q, k, v)),
                    note="dense cache" + (", jitted loop of steps" if calls > 1 else ""))


def _fa3_missing() -> str | None:
    reason = _jax_missing("cuda")()
    if reason is None and module("flash_attn3_jax") is None:
        return "flash_attn3_jax not installed"
    return reason


def _fa3_check(case):
    if case.dtype not in ("float16", "bfloat16"):
        raise ValueError(f"FlashAttention-3 takes float16 and bfloat16, not {case.dtype}")


@contextmanager
def _fa3_prepare(case, x):
    """FlashAttention-3 for JAX (flash_attn3_jax.flash_mha: BSHD, GQA, differentiable)."""
    _fa3_check(case)
    fa3 = module("flash_attn3_jax")
    q, k, v, dout = _jax_inputs(x)
    fn = functools.partial(fa3.flash_mha, is_causal=case.causal)
    yield _jax_passes(case, fn, q, k, v, dout, _jax_to_bshd(False), memory=_xla_memory)


@contextmanager
def _fa3_kvcache_prepare(case, x):
    """flash_attn3_jax.flash_mha_with_kvcache: the dense or paged cache with cache_seqlens (varlen: the
    padded cache with each sequence's length); num_splits the fastest of 1, 8 and 32 on this cell."""
    _fa3_check(case)
    jax = module("jax")
    fa3 = module("flash_attn3_jax")
    q, k, v, _ = _jax_inputs(x)
    lengths = jax.numpy.asarray(case.kv_lengths, dtype=jax.numpy.int32)
    if case.layout == "paged":
        kp, vp, table = paged_cache(x.k, x.v, case.page_size)
        k, v = jax.dlpack.from_dlpack(kp), jax.dlpack.from_dlpack(vp)
        table = jax.dlpack.from_dlpack(table)
    else:
        table = None
    caches = _cache_copies(case, (k, v) if table is None else (k, v, table))
    best = None
    for splits in (1, 8, 32):
        def step(q, k_cache, v_cache, page_table=None, splits=splits):
            return fa3.flash_mha_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, page_table=page_table,
                                              is_causal=case.causal, num_splits=splits)
        run, calls = _jax_decode_loop(step, q, caches, True)
        seconds = _time_once(run, jax.block_until_ready) / calls
        if best is None or seconds < best[0]:
            best = (seconds, splits, step, run, calls)
    _, splits, step, run, calls = best
    single = jax.jit(step)
    first = [True]

    def run_checked():
        if first[0]:
            first[0] = False
            return single(q, *caches[0])
        return run()
    yield Prepared(run=run_checked, to_bshd=_jax_to_bshd(False), wait=jax.block_until_ready, calls_per_run=calls,
                   memory=lambda: _xla_memory(single, q, *caches[0]),
                   note=f"num_splits={splits} (fastest of 1/8/32), jitted loop of steps"
                        + (", padded cache" if case.layout == "varlen" else ""))
@contextmanager
def _numpy_prepare(case, x):
    """softmax(Q K^T) V in the inputs' dtype, the scores materialized (the original baseline);
    the textbook backward from the saved probabilities; serving cells one sequence at a time.

    Queries are grouped per kv head, (B, Hkv, G, L, D), so GQA needs no copies of K and V."""
    if case.serving:
        yield Prepared(run=lambda: _numpy_serving(case, x))
        return
    b, seqlen, h, d = x.q.shape
    g = h // case.kv_heads
    q = np.ascontiguousarray(x.q.reshape(b, seqlen, case.kv_heads, g, d).transpose(0, 2, 3, 1, 4))
    kt = np.ascontiguousarray(x.k.transpose(0, 2, 3, 1))[:, :, None]  # (B, Hkv, 1, D, L)
    v = np.ascontiguousarray(x.v.transpose(0, 2, 1, 3))[:, :, None]  # (B, Hkv, 1, L, D)
    scale = x.q.dtype.type(1.0 / np.sqrt(d))
    # Adding a 0/-inf matrix is ~10x faster than assigning -inf through a boolean index.
    mask = np.triu(np.full((seqlen, seqlen), -np.inf, dtype=x.q.dtype), k=1)

    def to_bshd(t):  # (B, Hkv, G, L, D) -> (B, L, H, D)
        return t.transpose(0, 3, 1, 2, 4).reshape(b, seqlen, h, d)

    def forward():
        s = (q @ kt) * scale
        if case.causal:
            s += mask
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return s, s @ v

    if case.pass_name == "fwd":
        yield Prepared(run=lambda: to_bshd(forward()[1]))
        return
    dout = np.ascontiguousarray(x.dout.reshape(b, seqlen, case.kv_heads, g, d).transpose(0, 2, 3, 1, 4))
    k = np.ascontiguousarray(kt.swapaxes(-1, -2))
    vt = np.ascontiguousarray(v.swapaxes(-1, -2))

    def transposed(t):  # stacked matmuls of strided operands leave BLAS: copy first
        return np.ascontiguousarray(t.swapaxes(-1, -2))

    def backward(p, out):
        ds = p * (dout @ vt - (dout * out).sum(-1, keepdims=True))
        dq = (ds @ k) * scale
        dk = (transposed(ds) @ q).sum(axis=2) * scale  # a kv head's gradient sums over its group
        dv = (transposed(p) @ dout).sum(axis=2)
        return to_bshd(dq), dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3)

    if case.pass_name == "bwd":
        saved = forward()
        yield Prepared(run=lambda: backward(*saved))
        return

    def forward_backward():
        p, out = forward()
        return (to_bshd(out),) + backward(p, out)
    yield Prepared(run=forward_backward)


def _numpy_serving(case, x):
    """Each sequence's queries against its first kv_lengths[b] keys, causal aligned bottom-right."""
    b, lq, h, d = x.q.shape
    g = h // case.kv_heads
    out = np.empty_like(x.q)
    scale = x.q.dtype.type(1.0 / np.sqrt(d))
    for i, length in enumerate(case.kv_lengths):
        q = x.q[i].reshape(lq, case.kv_heads, g, d).transpose(1, 2, 0, 3)  # (Hkv, G, Lq, D)
        k = x.k[i, :length].transpose(1, 0, 2)[:, None]  # (Hkv, 1, Lk, D)
        v = x.v[i, :length].transpose(1, 0, 2)[:, None]
        s = (q @ k.swapaxes(-1, -2)) * scale
        if case.causal:
            s += np.triu(np.full((lq, length), -np.inf, dtype=s.dtype), k=length - lq + 1)
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        out[i] = (s @ v).transpose(2, 0, 1, 3).reshape(lq, h, d)
    return out


def _any_pass(case) -> bool:
    return True


def _dense_passes(case) -> bool:
    return case.layout == "dense"


def _training(case) -> bool:
    return case.layout == "dense" and case.pass_name != "fwd"


def _serving(case) -> bool:
    return case.serving


def _backward_only(case) -> bool:
    return case.layout == "dense" and case.pass_name == "bwd"


def _backend_applies(backend: str, with_backward: set) -> Callable:
    """The cells a CUDA backend takes: dense forwards; the backward passes where it has a backward;
    the serving layouts on `decode`, the backend that serves them on CUDA."""
    def applies(case) -> bool:
        if case.serving:
            return backend == "decode"
        return case.pass_name == "fwd" or backend in with_backward
    return applies


def registry(device: str) -> list[Impl]:
    """All implementations known for `device` ("cpu" or "cuda"), available or not; each takes
    part in the cells its `applies` accepts."""
    if device == "cpu":
        return [
            Impl("waveboost_cpu", _waveboost("cpu", "host"), _waveboost_missing("cpu", "cpu"), "waveboost",
                 applies=_any_pass),
            Impl("torch_sdpa", _sdpa(None), _needs("torch"), applies=_any_pass),
            Impl("jax_xla", _jax("xla"), _jax_missing("cpu"), score_bytes=8, applies=_any_pass),
            Impl("numpy", _numpy_prepare, lambda: None, score_bytes=12, applies=_any_pass),
        ]
    wb = module("waveboost")
    listed = wb.info().get("backends", ()) if hasattr(wb, "info") else ()
    extra = [b for b in listed if b not in WAVEBOOST_CUDA_BACKENDS + ("cpu", "auto")]
    with_backward = set(wb.backward_backends()) if hasattr(wb, "backward_backends") else set()
    impls = [Impl(f"waveboost_{b}", _waveboost(b, "cuda-event"), _waveboost_missing(b, "cuda"), "waveboost",
                  score_bytes=8 if b == "naive" else 0,  # naive: fp32 scores, then probabilities
                  applies=_backend_applies(b, with_backward))
             for b in WAVEBOOST_CUDA_BACKENDS + tuple(extra)]
    # What a training or serving user gets by default, and the bitwise-reproducible backward.
    impls += [Impl("waveboost_auto", _waveboost("auto", "cuda-event"), _waveboost_missing("auto", "cuda"),
                   "waveboost", applies=lambda case: case.serving or case.pass_name != "fwd"),
              Impl("waveboost_auto_det", _waveboost("auto", "cuda-event", deterministic=True),
                   _waveboost_missing("auto", "cuda"), "waveboost", applies=_backward_only)]
    # sdpa_math keeps fp32 scores, probabilities and casts: 9.7 GB measured for 1.07e9 scores.
    impls += [Impl(name, _sdpa(backend), _needs("torch"), score_bytes=10 if name == "sdpa_math" else 0,
                   applies=_any_pass)
              for name, backend in SDPA_BACKENDS.items()]
    impls += [Impl("jax_cudnn", _jax("cudnn"), _jax_missing("cuda"), applies=_any_pass),
              Impl("jax_xla", _jax("xla"), _jax_missing("cuda"), score_bytes=8, applies=_dense_passes),
              Impl("fa3", _fa3_prepare, _fa3_missing, applies=_dense_passes),
              Impl("fa3_kvcache", _fa3_kvcache_prepare, _fa3_missing, applies=_serving)]
    return impls
