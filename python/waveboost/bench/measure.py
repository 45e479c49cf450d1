"""One cell, one implementation: check against a float64 reference, then memory, then time.

Clocks: CUDA events on torch's current stream (where waveboost and torch SDPA launch), with
the L2 cache flushed before every call as triton.testing.do_bench does, so small inputs are
not served hot from L2; host perf_counter for the CPU and for JAX (its own stream), after a
device sync. Warm-up calls come first; the number of timed calls is what fits in the time
budget, between MIN_REPS and --repeats.
"""

from __future__ import annotations

import math
import time
import tracemalloc
import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .grid import Case
from .impls import Impl, module

# Frobenius-relative error allowed before a result is WRONG. Half precision: 8 unit
# roundoffs (2^-8, 2^-5); torch's own kernels sit near 3e-4 (fp16) and 2e-3 (bf16) on
# random normal inputs, while a wrong mask, scale or GQA head mapping gives > 1e-1.
# fp32 and fp64: DESIGN.md's bound for full-precision paths (TF32 matmuls fail it).
TOLERANCE = {"float16": 2.0**-8, "bfloat16": 2.0**-5, "float32": 1e-4, "float64": 1e-10}
# Gradients (each of dq, dk, dv) go through more roundings of P and dS to the input dtype: twice the
# half-precision bounds above (a wrong mask, scale or GQA reduction still gives > 1e-1).
TOLERANCE_BACKWARD = {"float16": 2.0**-7, "bfloat16": 2.0**-4, "float32": 1e-4, "float64": 1e-10}
MIN_REPS = 3
WARMUP_CALLS = 3
FLUSH_BYTES = 256 << 20  # triton do_bench's L2 flush buffer; > 4x the 50 MB L2 of an H100
_REF_CHUNK_ELEMENTS = 1 << 25  # float64 score rows per reference chunk: 256 MB


@dataclass
class Inputs:
    """BSHD q, k, v shared by every implementation of a cell; `dout`, the gradient flowing into the
    output, for the backward passes. Serving cells: k, v are (batch, longest KV length, heads_kv,
    head_dim), sequence b using its first `case.kv_lengths[b]` keys; adapters lay them out as they need."""

    q: object
    k: object
    v: object
    dout: object = None


@dataclass
class Settings:
    device: str
    repeats: int
    budget_s: float
    mem_limit_bytes: float
    seed: int = 0
    # IQR / median above which a cell's timed calls are re-run once; still above: marked unstable.
    spread_threshold: float = 0.10
    # Peak HBM bandwidth of the device (GB/s) for the serving cells' percentage; None: unknown.
    peak_gbs: float | None = None
    # Time the CUDA-event implementations by replaying a CUDA graph of one call: no host launch cost.
    cuda_graphs: bool = False


def make_inputs(case: Case, device: str, seed: int) -> Inputs:
    """Fresh random normal inputs (never zeros), generated on the device of the run."""
    q_shape = (case.batch, case.lq, case.heads, case.head_dim)
    kv_shape = (case.batch, case.max_seqlen_k, case.kv_heads, case.head_dim)
    shapes = (q_shape, kv_shape, kv_shape) + ((q_shape,) if case.pass_name != "fwd" else ())
    if device == "cpu":
        rng = np.random.default_rng(seed)
        return Inputs(*(rng.standard_normal(s, dtype=np.float64).astype(case.dtype) for s in shapes))
    torch = module("torch")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    return Inputs(*(torch.randn(s, generator=gen, device="cuda").to(dtype) for s in shapes))


def _checked_heads(case: Case) -> tuple[list, list]:
    """(batches, heads) whose output is compared: all when few, else the first and last batch
    and heads 0, group + 1 and H - 1, which read different kv heads under GQA."""
    if case.batch * case.heads <= 8:
        return list(range(case.batch)), list(range(case.heads))
    group = case.heads // case.kv_heads
    return sorted({0, case.batch - 1}), sorted({0, min(group + 1, case.heads - 1), case.heads - 1})


def _f64(xp, t):
    return t.astype(np.float64) if xp is np else t.double()


def _probabilities(xp, q_rows, k, first_row: int, causal: bool, scale: float):
    """softmax of the scaled scores of query rows `first_row`.. against k, float64; causal aligned
    bottom-right (query i sees keys j <= i + Lk - Lq, with Lq passed through `first_row`'s caller)."""
    s = (q_rows @ k.T) * scale
    if causal:
        rows = xp.arange(first_row, first_row + len(q_rows))
        cols = xp.arange(len(k))
        if xp is not np:
            rows, cols = rows.to(s.device), cols.to(s.device)
        s[cols[None, :] > rows[:, None]] = -math.inf
    top = xp.amax(s, -1, keepdims=True)
    seen = top > -math.inf  # a row that sees no key: zero probabilities, not NaN
    p = xp.exp(s - xp.where(seen, top, xp.zeros_like(top)))
    return p / xp.where(seen, p.sum(-1, keepdims=True), xp.ones_like(top))


def _attention_f64(q, k, v, causal: bool):
    """float64 softmax(q k^T / sqrt(D)) v of one (batch, head); q (Lq, D), k, v (Lk, D), NumPy or
    torch; causal aligned bottom-right."""
    xp = np if isinstance(q, np.ndarray) else module("torch")
    q, k, v = (_f64(xp, t) for t in (q, k, v))
    out = xp.empty_like(q)
    scale = 1.0 / math.sqrt(q.shape[-1])
    offset = len(k) - len(q)
    chunk = max(1, _REF_CHUNK_ELEMENTS // max(1, len(k)))
    for start in range(0, len(q), chunk):
        p = _probabilities(xp, q[start:start + chunk], k, start + offset, causal, scale)
        out[start:start + chunk] = p @ v
    return out


def _attention_grads_f64(q, k, v, dout, causal: bool):
    """float64 (out, dq, dk, dv) of one (batch, head): the textbook backward with P materialized
    per chunk of query rows (dS = P * (dO V^T - rowsum(dO * O)))."""
    xp = np if isinstance(q, np.ndarray) else module("torch")
    q, k, v, dout = (_f64(xp, t) for t in (q, k, v, dout))
    out, dq = xp.empty_like(q), xp.empty_like(q)
    dk, dv = xp.zeros_like(k), xp.zeros_like(v)
    scale = 1.0 / math.sqrt(q.shape[-1])
    offset = len(k) - len(q)
    chunk = max(1, _REF_CHUNK_ELEMENTS // max(1, len(k)))
    for start in range(0, len(q), chunk):
        rows = slice(start, start + chunk)
        p = _probabilities(xp, q[rows], k, start + offset, causal, scale)
        o = p @ v
        out[rows] = o
        ds = p * (dout[rows] @ v.T - (dout[rows] * o).sum(-1, keepdims=True))
        dq[rows] = (ds @ k) * scale
        dk += (ds.T @ q[rows]) * scale
        dv += p.T @ dout[rows]
    return out, dq, dk, dv


def _frobenius_rel(pairs) -> float:
    """sqrt(sum |got - ref|^2 / sum |ref|^2) over (got, ref) float64 pairs."""
    num = den = 0.0
    for got, ref in pairs:
        num += float(((got - ref) ** 2).sum())
        den += float((ref ** 2).sum())
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


class Reference:
    """float64 results of the checked heads, computed once per cell on first use.

    Forward: the output of the checked (batch, head) pairs. Backward passes: the first and last
    batch and kv heads 0 and Hkv - 1 with every query head that reads them, so that dk and dv
    (sums over a kv head's query heads) are checked whole; fwdbwd checks the output there too."""

    def __init__(self, case: Case, inputs: Inputs):
        self.case, self.inputs = case, inputs
        self.batches, self.heads = _checked_heads(case)

    @property
    def tolerance(self) -> float:
        table = TOLERANCE if self.case.pass_name == "fwd" else TOLERANCE_BACKWARD
        return table[self.case.dtype]

    def _kv(self, b: int, h: int):
        """K and V rows sequence b's head h attends to (its first kv_lengths[b] keys)."""
        x, group = self.inputs, self.case.heads // self.case.kv_heads
        length = self.case.kv_lengths[b]
        return x.k[b, :length, h // group], x.v[b, :length, h // group]

    @cached_property
    def outputs(self) -> list:
        x = self.inputs
        return [_attention_f64(x.q[b, :, h], *self._kv(b, h), self.case.causal)
                for b in self.batches for h in self.heads]

    @cached_property
    def grad_heads(self) -> tuple[list, list]:
        """(batches, kv heads) whose gradients are checked."""
        case = self.case
        return sorted({0, case.batch - 1}), sorted({0, case.kv_heads - 1})

    @cached_property
    def gradients(self) -> dict:
        """{("out"|"dq", b, h) or ("dk"|"dv", b, kv_head): float64 array}."""
        x, case = self.inputs, self.case
        group = case.heads // case.kv_heads
        expected = {}
        batches, kv_heads = self.grad_heads
        for b in batches:
            for j in kv_heads:
                for h in range(j * group, (j + 1) * group):
                    o, dq, dk, dv = _attention_grads_f64(x.q[b, :, h], *self._kv(b, h), x.dout[b, :, h], case.causal)
                    expected["out", b, h], expected["dq", b, h] = o, dq
                    if ("dk", b, j) in expected:
                        expected["dk", b, j] += dk
                        expected["dv", b, j] += dv
                    else:
                        expected["dk", b, j], expected["dv", b, j] = dk, dv
        return expected

    def rel_err(self, result) -> float:
        """Frobenius-relative error of an implementation's BSHD result on the checked heads, the
        largest over its parts (fwd: out; bwd: dq, dk, dv; fwdbwd: out, dq, dk, dv); inf if any
        element of any part is not finite."""
        parts = {"fwd": ("out",), "bwd": ("dq", "dk", "dv"), "fwdbwd": ("out", "dq", "dk", "dv")}[self.case.pass_name]
        arrays = (result,) if self.case.pass_name == "fwd" else tuple(result)
        if len(arrays) != len(parts):
            raise ValueError(f"expected {len(parts)} results ({', '.join(parts)}), got {len(arrays)}")
        xp = np if isinstance(arrays[0], np.ndarray) else module("torch")
        if not all(bool(xp.isfinite(a).all()) for a in arrays):
            return math.inf
        if self.case.pass_name == "fwd":
            pairs = [(b, h) for b in self.batches for h in self.heads]
            return _frobenius_rel((_f64(xp, result[b, :, h]), ref) for (b, h), ref in zip(pairs, self.outputs))
        worst = 0.0
        for name, got in zip(parts, arrays):
            pairs = [(_f64(xp, got[b, :, h]), ref) for (kind, b, h), ref in self.gradients.items() if kind == name]
            worst = max(worst, _frobenius_rel(pairs))
        return worst


# ---- memory ---------------------------------------------------------------------------------

class _DefaultMemPool:
    """High watermark of the device's default CUDA memory pool, which serves cudaMallocAsync
    (waveboost's naive workspace) and which torch's allocator does not see. Driver API via ctypes."""

    _USED_MEM_CURRENT, _USED_MEM_HIGH = 7, 8  # CUmemPool_attribute

    def __init__(self, ordinal: int):
        import ctypes
        self._ctypes = ctypes
        self._cuda = ctypes.CDLL("libcuda.so.1")
        device, self._pool = ctypes.c_int(), ctypes.c_void_p()
        self._check(self._cuda.cuDeviceGet(ctypes.byref(device), ordinal))
        self._check(self._cuda.cuDeviceGetDefaultMemPool(ctypes.byref(self._pool), device))

    @staticmethod
    def _check(status: int):
        if status != 0:
            raise OSError(f"CUDA driver call failed with status {status}")

    def _get(self, attr: int) -> int:
        value = self._ctypes.c_uint64()
        self._check(self._cuda.cuMemPoolGetAttribute(self._pool, attr, self._ctypes.byref(value)))
        return value.value

    def reset(self) -> int:
        """Resets the high watermark to the bytes in use now and returns them."""
        zero = self._ctypes.c_uint64(0)
        self._check(self._cuda.cuMemPoolSetAttribute(self._pool, self._USED_MEM_HIGH, self._ctypes.byref(zero)))
        return self._get(self._USED_MEM_CURRENT)

    def high(self) -> int:
        return self._get(self._USED_MEM_HIGH)


def default_mempool():
    """The device's default memory pool, or None where the driver call is unavailable."""
    torch = module("torch")
    try:
        return _DefaultMemPool(torch.cuda.current_device())
    except (OSError, AttributeError):
        return None


def _proc_status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure_memory(prep, device: str, mempool=None) -> tuple[int, str]:
    """Peak extra memory of one call, output included, inputs excluded -> (bytes, method).

    CUDA: torch allocator peak minus what was allocated before, plus the default mempool's
    high watermark minus its use before. CPU: the largest of tracemalloc's peak (NumPy and
    Python allocations), the peak-RSS growth (everything, at page granularity) and the
    output's size. Memory that malloc kept from earlier calls is reused unseen by RSS, so the
    CPU number is a lower bound for allocations made outside NumPy (torch, C++)."""
    if prep.memory is not None:
        return prep.memory()
    if device == "cuda":
        torch = module("torch")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        pool_base = mempool.reset() if mempool else 0
        out = prep.run()
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        if mempool:
            extra += max(0, mempool.high() - pool_base)
        del out
        return extra, "torch-allocator+cuda-mempool" if mempool else "torch-allocator"
    rss_ok = _reset_peak_rss()
    rss_base = _proc_status_kb("VmRSS")
    tracemalloc.start()
    try:
        out = prep.run()
        prep.wait(out)
        traced = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    hwm = _proc_status_kb("VmHWM")
    output = int(getattr(out, "nbytes", 0))  # torch's CPU allocator is invisible to tracemalloc
    del out
    if rss_ok and rss_base is not None and hwm is not None:
        return max(traced, (hwm - rss_base) * 1024, output), "max(tracemalloc,rss-peak,output)"
    return max(traced, output), "max(tracemalloc,output)"


# ---- time -----------------------------------------------------------------------------------

def _sync(device: str):
    if device == "cuda":
        module("torch").cuda.synchronize()


def _graph_of_one_call(prep):
    """A CUDA graph of one prep.run(), warmed up on a side stream first as torch asks."""
    torch = module("torch")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        prep.run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prep.run()
    return graph


def time_calls(prep, settings: Settings, flush=None) -> list[float]:
    """Milliseconds of the timed calls, after warm-up."""
    device = settings.device
    start = time.perf_counter()
    for _ in range(WARMUP_CALLS):
        prep.wait(prep.run())
    _sync(device)
    estimate = (time.perf_counter() - start) / WARMUP_CALLS
    reps = int(min(settings.repeats, max(MIN_REPS, settings.budget_s // max(estimate, 1e-9))))
    if prep.clock == "cuda-event":
        torch = module("torch")
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        call = _graph_of_one_call(prep).replay if settings.cuda_graphs else prep.run
        for begin, end in events:
            if flush is not None:
                flush.zero_()
            begin.record()
            call()
            end.record()
        torch.cuda.synchronize()
        return [begin.elapsed_time(end) / prep.calls_per_run for begin, end in events]
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        _sync(device)
        t0 = time.perf_counter()
        prep.wait(prep.run())
        times.append((time.perf_counter() - t0) * 1e3 / prep.calls_per_run)
    return times


def _summary(case: Case, times: list[float], peak_gbs: float | None = None) -> dict:
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    seconds = median * 1e-3
    summary = {"reps": len(times), "median_ms": median, "q1_ms": q1, "q3_ms": q3,
               "min_ms": min(times), "max_ms": max(times),
               "spread": float((q3 - q1) / median) if median > 0 else 0.0,
               "tflops": case.flops / seconds / 1e12, "tokens_per_s": case.tokens / seconds}
    if case.serving:
        summary["gb_s"] = case.bytes_moved / seconds / 1e9
        summary["pct_peak"] = 100 * summary["gb_s"] / peak_gbs if peak_gbs else None
    return summary


# ---- one cell -------------------------------------------------------------------------------

def _classify(exc: Exception, caught) -> tuple[str, str]:
    """(status, reason) for an exception raised by an implementation: never a crash."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = str(exc).lower()
    if isinstance(exc, MemoryError) or "out of memory" in lowered or "resource_exhausted" in lowered:
        return "skipped", "out of memory"
    if "no available kernel" in lowered or "no viable backend" in lowered:
        # torch says why a forced kernel declined in warnings: "<kernel> not used because:"
        # headers, each followed by the reason, "(Triggered internally at ...)" appended.
        reasons = []
        for w in caught:
            line = str(w.message).split("(Triggered internally")[0].strip()
            if line and not line.endswith(":") and line not in reasons:
                reasons.append(line)
        return "unsupported", ("; ".join(reasons) or text)[:200]
    if isinstance(exc, (ValueError, NotImplementedError, TypeError)):
        return "unsupported", text[:200]
    return "error", f"{type(exc).__name__}: {text}"[:200]


def run_cell(case: Case, impl: Impl, inputs: Inputs, reference: Reference, settings: Settings,
             flush=None, mempool=None) -> dict:
    """The result row of `impl` on `case`: status ok / WRONG / unsupported / skipped / error."""
    row = {**case.fields(), "impl": impl.name, "status": "ok", "reason": "", "rel_err": None, "clock": ""}
    need = case.score_elements * impl.score_bytes
    if need > settings.mem_limit_bytes:
        row.update(status="skipped", reason=f"memory: scores need ~{need / 1e9:.0f} GB "
                                            f"> limit {settings.mem_limit_bytes / 1e9:.0f} GB")
        return row
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with impl.prepare(case, inputs) as prep:
                row["clock"] = "cuda-graph" if settings.cuda_graphs and prep.clock == "cuda-event" else prep.clock
                out = prep.run()
                prep.wait(out)
                row["rel_err"] = err = reference.rel_err(prep.to_bshd(out))
                del out
                if not err <= reference.tolerance:
                    row.update(status="WRONG", reason=f"rel err {err:.2e} > {reference.tolerance:.1e}")
                    return row
                row["reason"] = prep.note
                row["mem_extra_bytes"], row["mem_method"] = measure_memory(prep, settings.device, mempool)
                timing = _summary(case, time_calls(prep, settings, flush), settings.peak_gbs)
                if timing["spread"] > settings.spread_threshold:  # the calls disagree: time them again
                    again = _summary(case, time_calls(prep, settings, flush), settings.peak_gbs)
                    timing = min(timing, again, key=lambda t: t["spread"])
                    row["retimed"] = True
                row.update(timing, unstable=bool(timing["spread"] > settings.spread_threshold))
        except Exception as exc:  # noqa: BLE001 -- any failure of a peer is a visible row, not a crash
            row["status"], row["reason"] = _classify(exc, caught)
            if settings.device == "cuda" and row["reason"] == "out of memory":
                module("torch").cuda.empty_cache()
    return row
