"""Concurrency: many Python threads calling at once give the serial results bitwise, and the GIL is
released while the C++ side works."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import waveboost
from reference import random_qkv

DEV = "cuda"

# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, dtype)
CPU_CASES = [
    (1, 37, 80, 4, 2, 64, True, np.float32),
    (2, 130, 61, 2, 1, 32, True, np.float64),
    (3, 7, 300, 8, 8, 16, False, np.float32),
    (1, 257, 257, 2, 2, 80, False, np.float64),
    (2, 64, 129, 6, 3, 128, True, np.float32),
    (1, 1, 1000, 4, 1, 64, False, np.float32),
]


def test_cpu_threads_match_serial_bitwise():
    rng = np.random.default_rng(0)
    inputs = [(random_qkv(rng, b, lq, lk, h, hkv, d, dt), causal) for b, lq, lk, h, hkv, d, causal, dt in CPU_CASES]
    serial = [waveboost.attention(*qkv, causal=causal, return_lse=True) for qkv, causal in inputs]

    def call(i):
        qkv, causal = inputs[i % len(inputs)]
        return i, waveboost.attention(*qkv, causal=causal, return_lse=True)

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(call, range(96)))
    for i, (out, lse) in results:
        ref_out, ref_lse = serial[i % len(inputs)]
        assert np.array_equal(out, ref_out) and np.array_equal(lse, ref_lse), f"call {i} differs from serial"


def test_cpu_call_releases_the_gil():
    """A second Python thread makes progress while a CPU-path call runs.

    With the switch interval at 60 s, a thread holding the GIL keeps it until it blocks: a C++ call
    that held the GIL through its work would let the counter thread run zero times between the two
    reads of `count` around it. The counter thread sleeps (releasing the GIL) between increments.
    """
    q, k, v = random_qkv(np.random.default_rng(1), 1, 1024, 1024, 8, 8, 64, np.float64)  # ~0.1-1 s of work
    count = [0]
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1
            time.sleep(1e-4)

    old_interval = sys.getswitchinterval()
    thread = threading.Thread(target=counter)
    thread.start()
    try:
        while count[0] == 0:  # the counter is running
            time.sleep(1e-3)
        sys.setswitchinterval(60.0)
        before = count[0]
        out = waveboost.attention(q, k, v, causal=True, backend="cpu")
        during = count[0] - before
    finally:
        sys.setswitchinterval(old_interval)
        stop.set()
        thread.join()
    assert np.isfinite(out).all()
    assert during > 0, "no other Python thread ran while waveboost computed: the GIL was held"


# ---------------------------------------------------------------------------------------------
# GPU: threads x streams
# ---------------------------------------------------------------------------------------------

GPU_CASES = [  # (path, dtype name, batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal)
    ("naive", "fp32", 2, 97, 130, 4, 2, 64, True),
    ("naive", "fp16", 1, 300, 70, 8, 1, 80, True),
    ("simt", "fp32", 2, 257, 300, 8, 2, 128, True),
    ("simt", "bf16", 1, 100, 513, 4, 4, 64, False),
    ("wmma", "fp16", 2, 513, 700, 8, 2, 128, True),
    ("wmma", "bf16", 1, 77, 1025, 4, 1, 64, False),
    ("mma", "fp16", 2, 1000, 1000, 8, 8, 64, True),
    ("mma", "bf16", 1, 129, 400, 16, 2, 128, True),
]


@pytest.mark.gpu
def test_gpu_threads_and_streams_match_serial_bitwise():
    torch = pytest.importorskip("torch", reason="the GPU tests drive the kernels through PyTorch")
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    g = torch.Generator(device=DEV).manual_seed(0)
    inputs = []
    for path, dname, b, lq, lk, h, hkv, d, causal in GPU_CASES:
        mk = lambda *s: torch.randn(*s, generator=g, device=DEV).to(dtypes[dname])  # noqa: E731
        inputs.append((path, causal, mk(b, lq, h, d), mk(b, lk, hkv, d), mk(b, lk, hkv, d)))
    serial = [waveboost.attention(q, k, v, causal=c, return_lse=True, backend=p) for p, c, q, k, v in inputs]
    torch.cuda.synchronize()

    n_threads, calls_per_thread = 8, 12
    barrier = threading.Barrier(n_threads)

    def worker(t):
        stream = torch.cuda.Stream()
        results = []
        barrier.wait()  # every thread launches at once
        with torch.cuda.stream(stream):
            for i in range(calls_per_thread):
                j = (t + i) % len(inputs)
                path, causal, q, k, v = inputs[j]
                results.append((j, waveboost.attention(q, k, v, causal=causal, return_lse=True, backend=path)))
        stream.synchronize()
        return results

    with ThreadPoolExecutor(max_workers=n_threads) as pool:
        all_results = list(pool.map(worker, range(n_threads)))
    torch.cuda.synchronize()
    for t, results in enumerate(all_results):
        for j, (out, lse) in results:
            assert torch.equal(out, serial[j][0]) and torch.equal(lse, serial[j][1]), \
                f"thread {t}, case {GPU_CASES[j][:2]}: differs from the serial call"
