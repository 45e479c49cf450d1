"""Streams: every call runs on its caller's stream and nothing synchronizes the device.

GPU: two calls on two streams run while a third stream works, each behind a long sleep kernel
on its own stream. Calls that used another stream (the legacy default one, say) would read
their NaN-poisoned inputs before the sleep ends; calls that synchronized the device or a stream
would hand the host back only after the sleeps. The same for CuPy's current stream. (CUDA-graph
capture in test_torch_integration.py is the other proof: capture fails on any synchronization.)
CPU: the sources hold no device-wide synchronization, no synchronous allocation or copy, and no
kernel launch without an explicit stream, so a new path cannot quietly add one.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
import waveboost

ROOT = pathlib.Path(__file__).resolve().parents[1]
CUDA_BACKENDS = [b for b in waveboost.BACKENDS if b != "cpu"]
# torch.cuda._sleep spins for this many GPU clock cycles: ~0.1 s at 1-2 GHz. The third stream
# sleeps ten times longer, so it is still busy when the two calls are done whatever the clock.
SHORT_SLEEP = 200_000_000
LONG_SLEEP = 10 * SHORT_SLEEP


# ---------------------------------------------------------------------------------------------
# CPU: the sources
# ---------------------------------------------------------------------------------------------

# Calls that wait for the whole device, or allocate/copy synchronously (which serializes with
# every stream and breaks CUDA-graph capture), and the legacy/per-thread default stream handles.
FORBIDDEN = [r"cudaDeviceSynchronize", r"cudaThreadSynchronize", r"cudaStreamLegacy", r"cudaStreamPerThread",
             r"cudaMalloc\s*\(", r"cudaMallocManaged\s*\(", r"cudaMallocHost\s*\(", r"cudaFree\s*\(",
             r"cudaFreeHost\s*\(", r"cudaMemcpy\s*\(", r"cudaMemcpy2D\s*\(", r"cudaMemset\s*\(",
             r"cudaMemcpyToSymbol\s*\(", r"cudaEventSynchronize"]
# The one stream synchronization: stream_synchronize(), for eager JAX through DLPack without the FFI.
STREAM_SYNC_ALLOWED = {"src/attention.cpp"}


def _sources():
    files = [p for d in ("src", "include") for p in (ROOT / d).rglob("*") if p.suffix in {".cpp", ".cu", ".h", ".cuh"}]
    assert files, f"no C++/CUDA sources found under {ROOT}"
    for path in files:
        code = re.sub(r"//[^\n]*", "", path.read_text())  # comments may name what the code avoids
        yield path.relative_to(ROOT).as_posix(), code


def test_sources_never_synchronize_the_device():
    found = [f"{name}: {m.group(0)}" for name, code in _sources() for pattern in FORBIDDEN
             for m in re.finditer(pattern, code)]
    found += [f"{name}: cudaStreamSynchronize" for name, code in _sources()
              if "cudaStreamSynchronize" in code and name not in STREAM_SYNC_ALLOWED]
    assert not found, "device-wide or synchronous CUDA calls:\n" + "\n".join(found)


def test_every_kernel_launch_names_a_stream():
    # <<<grid, block>>> and <<<grid, block, smem>>> launch on the legacy default stream.
    unnamed = []
    for name, code in _sources():
        for m in re.finditer(r"<<<(.*?)>>>", code, flags=re.DOTALL):
            depth, commas = 0, 0
            for ch in m.group(1):
                depth += ch in "(<[{"
                depth -= ch in ")>]}"
                commas += ch == "," and depth == 0
            if commas < 3:
                unnamed.append(f"{name}: <<<{' '.join(m.group(1).split())}>>>")
    assert not unnamed, "kernel launches without a stream:\n" + "\n".join(unnamed)


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------

def _torch_qkv(torch, seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(2, 300, 8, 128), (2, 500, 2, 128), (2, 500, 2, 128)]
    return [torch.randn(*s, generator=g, device="cuda", dtype=torch.float32).to(dtype) for s in shapes]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_two_streams_concurrent_with_a_third(backend):
    torch = pytest.importorskip("torch")
    import waveboost.torch as wbt

    cases = [_torch_qkv(torch, seed, torch.float16) for seed in (1, 2)]
    try:
        waveboost.resolve_backend(*cases[0], causal=True, backend=backend)
    except ValueError as e:
        pytest.skip(f"backend {backend!r} cannot run these inputs here: {e}")
    # Expected results on the default stream; this also warms up every lazy first-call cost
    # (the custom op's first call sets up torch's dispatch, which can outlast SHORT_SLEEP).
    expected = [waveboost.attention(*qkv, causal=True, return_lse=True, backend=backend) for qkv in cases]
    wbt.attention(*cases[0], causal=True, return_lse=True, backend=backend)
    # The third stream's work too: the process's first matmul creates cuBLAS's handle and workspace.
    warm = torch.randn(2048, 2048, device="cuda")
    torch.cuda._sleep(1000)
    warm @ warm
    torch.cuda.synchronize()

    first, second, third = (torch.cuda.Stream() for _ in range(3))

    def enqueue_calls(sleep):
        results = []
        for stream, qkv in zip((first, second), cases):
            with torch.cuda.stream(stream):
                inputs = [torch.full_like(t, float("nan")) for t in qkv]
                torch.cuda._sleep(sleep)
                for buffer, value in zip(inputs, qkv):
                    buffer.copy_(value)  # the inputs hold their values only after the sleep, in this stream's order
                results.append(waveboost.attention(*inputs, causal=True, return_lse=True, backend=backend))
                results.append(wbt.attention(*inputs, causal=True, return_lse=True, backend=backend))  # the custom op
        return results

    # A rehearsal fills torch's caching allocator for these streams: a stream's first allocations
    # call cudaMalloc, which may wait for the device and would stall the host behind the third stream.
    enqueue_calls(1000)
    with torch.cuda.stream(third):
        rehearsal = torch.randn(2048, 2048, device="cuda")
        rehearsal @ rehearsal
    del rehearsal
    torch.cuda.synchronize()
    with torch.cuda.stream(third):  # unrelated work on a third stream
        torch.cuda._sleep(LONG_SLEEP)
        busy = torch.randn(2048, 2048, device="cuda")
        busy = busy @ busy
    results = enqueue_calls(SHORT_SLEEP)

    assert not (first.query() or second.query() or third.query()), (
        "the host waited for GPU work: something synchronized the device or a stream")
    first.synchronize()
    second.synchronize()
    assert not third.query(), "the calls waited for the third stream's work"
    for i, (out, lse) in enumerate(results):
        expected_out, expected_lse = expected[i // 2]
        assert torch.equal(out, expected_out) and torch.equal(lse, expected_lse), f"call {i} read unready inputs"
    third.synchronize()
    assert torch.isfinite(busy).all()


@pytest.mark.gpu
def test_cupy_runs_on_its_current_stream():
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(s).astype(np.float16) for s in [(2, 300, 8, 64), (2, 400, 2, 64), (2, 400, 2, 64)]]
    qkv = [cupy.asarray(a) for a in host]
    expected_out, expected_lse = waveboost.attention(*qkv, causal=True, return_lse=True)
    cupy.cuda.Device().synchronize()

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        inputs = [cupy.full(a.shape, np.nan, dtype=np.float16) for a in host]
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
            torch.cuda._sleep(SHORT_SLEEP)  # CuPy has no sleep kernel; torch enqueues one on CuPy's stream
        for buffer, value in zip(inputs, qkv):
            buffer[...] = value
        out, lse = waveboost.attention(*inputs, causal=True, return_lse=True)
    assert not stream.done, "the host waited for GPU work: something synchronized the device or the stream"
    stream.synchronize()
    assert isinstance(out, cupy.ndarray) and out.dtype == np.float16 and isinstance(lse, cupy.ndarray)
    assert bool(cupy.array_equal(out, expected_out)) and bool(cupy.array_equal(lse, expected_lse)), (
        "the call did not run on CuPy's current stream")
