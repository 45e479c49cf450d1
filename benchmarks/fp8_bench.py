"""FP8 (e4m3) forward against bf16 and the peers, head dim 128, the FA2 grid (16k tokens, 16 heads).

Forward TFLOP/s counting 4 * B * H * L^2 * D (halved for causal). waveboost e4m3 (q, k, v in
float8_e4m3fn, out bf16) and bf16, SDPA cuDNN bf16 (torch), and when importable FlashAttention-3
bf16 (flash_attn3_jax) and cuDNN's FP8 attention through JAX. torch kernels: CUDA events around each
call after warm-up, median of --repeats; JAX: wall time of 10 back-to-back calls, median of
--repeats / 2 groups (the shapes are GPU-bound). Then the accuracy of e4m3 and bf16 against float64
on one shape.

    python benchmarks/fp8_bench.py [--repeats 30] [--lengths 512,1024,...] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import waveboost

D, H, TOKENS = 128, 16, 16384


def cuda_ms(fn, repeats):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def jax_ms(fn, args, repeats):
    out = fn(*args)
    out = fn(*args)
    (out[0] if isinstance(out, tuple) else out).block_until_ready()
    times = []
    for _ in range(max(3, repeats // 2)):
        t0 = time.perf_counter()
        for _ in range(10):
            out = fn(*args)
        (out[0] if isinstance(out, tuple) else out).block_until_ready()
        times.append((time.perf_counter() - t0) / 10 * 1e3)
    return statistics.median(times)


def jax_peers():
    """name -> fn(q, k, v, causal) on JAX arrays (BSHD), for the peers that import."""
    peers = {}
    try:
        import jax
        import jax.numpy as jnp
    except Exception:
        return peers, None
    try:
        import flash_attn3_jax

        peers["fa3_bf16"] = lambda causal: jax.jit(lambda q, k, v: flash_attn3_jax.flash_mha(q, k, v, is_causal=causal))
    except Exception:
        pass
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa

        def cudnn_fp8(causal):
            params = {name: jnp.ones((1, 1, 1, 1), jnp.float32) for name in fa.fp8_params_keys}
            mask = fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK
            return jax.jit(lambda q, k, v: fa.dot_product_attention(q, k, v, scale=1 / math.sqrt(D), mask_type=mask,
                                                                    use_fp8=True, fp8_params=params)[0])
        peers["cudnn_fp8"] = cudnn_fp8
    except Exception:
        traceback.print_exc()
    return peers, jax


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    e4m3 = torch.float8_e4m3fn
    peers, jax = jax_peers()
    cols = ["wb_fp8", "wb_bf16", "sdpa_cudnn"] + sorted(peers)
    print(f"{torch.cuda.get_device_name(0)}; head_dim {D}, {H} heads, {TOKENS} tokens; forward TFLOP/s")
    print(f"{'L':>6} {'causal':>6} " + " ".join(f"{c:>11}" for c in cols) + "  fp8/bf16  fp8/best-peer")
    rows = []
    for causal in (False, True):
        for L in map(int, args.lengths.split(",")):
            B = TOKENS // L
            g = torch.Generator(device="cuda").manual_seed(L)
            q, k, v = (torch.randn(B, L, H, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            q8, k8, v8 = (x.to(e4m3) for x in (q, k, v))
            flops = 4 * B * H * L * L * D / (2 if causal else 1)
            ms = {}
            ms["wb_fp8"] = cuda_ms(lambda: waveboost.attention(q8, k8, v8, causal=causal), args.repeats)
            ms["wb_bf16"] = cuda_ms(lambda: waveboost.attention(q, k, v, causal=causal), args.repeats)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ms["sdpa_cudnn"] = cuda_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                           args.repeats)
            if peers:
                import jax.numpy as jnp

                jq, jk, jv = (jnp.asarray(x.float().cpu().numpy()) for x in (q, k, v))
                for name, make in peers.items():
                    try:
                        dt = jnp.float8_e4m3fn if name.endswith("fp8") else jnp.bfloat16
                        ms[name] = jax_ms(make(causal), tuple(x.astype(dt) for x in (jq, jk, jv)), args.repeats)
                    except Exception as e:  # a peer that cannot run this shape
                        print(f"  {name} L={L} causal={causal}: {type(e).__name__}: {str(e)[:160]}", file=sys.stderr)
                        ms[name] = float("nan")
            tf = {c: flops / (ms[c] * 1e-3) / 1e12 if c in ms else float("nan") for c in cols}
            peer_best = max((tf[c] for c in cols if c not in ("wb_fp8", "wb_bf16") and not math.isnan(tf[c])),
                            default=float("nan"))
            print(f"{L:>6} {str(causal):>6} " + " ".join(f"{tf[c]:>11.0f}" for c in cols) +
                  f"  {tf['wb_fp8'] / tf['wb_bf16']:>8.2f}  {tf['wb_fp8'] / peer_best:>13.2f}", flush=True)
            rows.append({"L": L, "causal": causal, **{f"{c}_tflops": round(tf[c], 1) for c in cols}})
            del q, k, v, q8, k8, v8, qt, kt, vt
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    # Accuracy against float64 (unit-scale inputs; e4m3 values compared with the same values in float64).
    sys.path.insert(0, "tests")
    from reference import attention_ref_torch as reference

    print("\naccuracy vs float64 (B=1, L=4096, H=4, D=128): max |err|, mean |err|, max |ref|")
    g = torch.Generator(device="cuda").manual_seed(1)
    x = [torch.randn(1, 4096, 4, D, generator=g, device="cuda") for _ in range(3)]
    for causal in (False, True):
        for name, dt in (("e4m3", e4m3), ("bf16", torch.bfloat16)):
            qq, kk, vv = (t.to(dt) for t in x)
            out = waveboost.attention(qq, kk, vv, causal=causal)
            ref, _ = reference(qq.double(), kk.double(), vv.double(), causal, 1 / math.sqrt(D))
            err = (out.double() - ref).abs()
            print(f"  {name} causal={causal}: {err.max().item():.2e} {err.mean().item():.2e} "
                  f"{ref.abs().max().item():.2f}")


if __name__ == "__main__":
    main()
