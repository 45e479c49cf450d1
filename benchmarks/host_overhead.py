"""Host time per call: what a launch-bound caller pays before the GPU sees the kernel.

Queues many calls on tiny inputs (B=1, L=16, H=1, D=64, fp16) that the GPU finishes faster than
the host can launch them, so the wall time per call is the host's: Python, the adapters, the
DLPack import and the launch. SDPA's flash kernel on the same tensors for comparison.

    python benchmarks/host_overhead.py
"""

from __future__ import annotations

import sys
import time

import waveboost


def per_call_us(fn, sync, calls=5000):
    for _ in range(100):
        fn()
    sync()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main():
    rows = []
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = (torch.randn(1, 16, 1, 64, device="cuda", dtype=torch.float16) for _ in range(3))
        sync = torch.cuda.synchronize
        rows.append(("torch, waveboost.attention", per_call_us(lambda: waveboost.attention(q, k, v), sync)))
        rows.append(("torch, + return_lse", per_call_us(lambda: waveboost.attention(q, k, v, return_lse=True), sync)))
        import waveboost.torch as wbt

        rows.append(("torch, waveboost.torch.attention (op)", per_call_us(lambda: wbt.attention(q, k, v), sync)))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            rows.append(("torch, SDPA flash", per_call_us(lambda: F.scaled_dot_product_attention(qt, kt, vt), sync)))
    except ImportError:
        pass
    try:
        import cupy

        qc, kc, vc = (cupy.random.standard_normal((1, 16, 1, 64)).astype(cupy.float16) for _ in range(3))
        sync = cupy.cuda.get_current_stream().synchronize
        rows.append(("cupy, waveboost.attention", per_call_us(lambda: waveboost.attention(qc, kc, vc), sync)))
    except ImportError:
        pass
    for name, us in rows:
        print(f"{name:<40} {us:6.1f} us/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
