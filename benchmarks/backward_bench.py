"""Backward and forward+backward throughput: waveboost's mma backward against PyTorch SDPA's flash and
cuDNN backends, on the FlashAttention-2 grid (16k tokens, hidden 2048: batch = 16384 / L, heads =
2048 / head_dim), one dtype, head dims 64 and 128, causal and not.

FLOPs: forward 4 * B * H * L^2 * D, backward 2.5x that, forward+backward 3.5x; all halved when causal.
Times: CUDA events around each call after warm-up, median of the repeats, random normal inputs.
waveboost's forward+backward is backend "auto" forward then backend "mma" backward (plus one row with
deterministic=True for the backward alone). Each cell also checks that mma's gradients agree with
SDPA flash's (max abs difference, printed).

    python benchmarks/backward_bench.py [--dtype bf16] [--lengths 1024 4096] [--repeats 20] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import waveboost

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def median_ms(fn, repeats):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def sdpa_fns(backend, q, k, v, dout, causal):
    """(backward alone, forward + backward) closures for an SDPA backend; inputs are BSHD."""
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
    dt = dout.transpose(1, 2)
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    def bwd():
        return torch.autograd.grad(out, (qt, kt, vt), dt, retain_graph=True)

    def fwd_bwd():
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return torch.autograd.grad(o, (qt, kt, vt), dt)

    return bwd, fwd_bwd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, waveboost {waveboost.__version__}, "
          f"{args.dtype}", flush=True)

    rows = []
    for d in args.head_dims:
        for L in args.lengths:
            for causal in (False, True):
                b, h = args.tokens // L, args.hidden // d
                g = torch.Generator(device="cuda").manual_seed(L + d)
                q, k, v, dout = (torch.randn(b, L, h, d, generator=g, device="cuda", dtype=dtype) for _ in range(4))
                fwd_flops = 4 * b * h * L * L * d / (2 if causal else 1)
                out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

                def wb_bwd(det=False):
                    return waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, dq=dq, dk=dk, dv=dv,
                                                        deterministic=det, backend="mma")

                def wb_fwd_bwd():
                    o, l_ = waveboost.attention(q, k, v, causal=causal, return_lse=True)
                    return waveboost.attention_backward(dout, q, k, v, o, l_, causal=causal, dq=dq, dk=dk, dv=dv,
                                                        backend="mma")

                fl_bwd, fl_fwd_bwd = sdpa_fns(SDPBackend.FLASH_ATTENTION, q, k, v, dout, causal)
                cu_bwd, cu_fwd_bwd = sdpa_fns(SDPBackend.CUDNN_ATTENTION, q, k, v, dout, causal)

                # Agreement with SDPA flash's gradients (same inputs).
                wb = wb_bwd()
                ref = fl_bwd()
                torch.cuda.synchronize()
                diff = max((a.float() - r.transpose(1, 2).float()).abs().max().item() for a, r in zip(wb, ref))

                series = [("mma", "bwd", lambda: wb_bwd(False)), ("mma deterministic", "bwd", lambda: wb_bwd(True)),
                          ("sdpa flash", "bwd", fl_bwd), ("sdpa cudnn", "bwd", cu_bwd),
                          ("waveboost", "fwd+bwd", wb_fwd_bwd), ("sdpa flash", "fwd+bwd", fl_fwd_bwd),
                          ("sdpa cudnn", "fwd+bwd", cu_fwd_bwd)]
                for impl, pas, fn in series:
                    ms = median_ms(fn, args.repeats)
                    flops = fwd_flops * (2.5 if pas == "bwd" else 3.5)
                    rows.append({"dtype": args.dtype, "head_dim": d, "seqlen": L, "batch": b, "heads": h,
                                 "causal": causal, "impl": impl, "pass": pas, "ms": round(ms, 4),
                                 "tflops": round(flops / ms / 1e9, 1), "max_abs_diff_vs_flash": round(diff, 5)})
                cell = [r for r in rows if r["head_dim"] == d and r["seqlen"] == L and r["causal"] == causal]
                print(f"D={d} L={L} causal={causal}: " +
                      ", ".join(f"{r['impl']} {r['pass']} {r['tflops']}" for r in cell) + f"; |mma - flash| {diff:.3g}",
                      flush=True)
                del q, k, v, dout, out, lse, dq, dk, dv, fl_bwd, fl_fwd_bwd, cu_bwd, cu_fwd_bwd

    # Table: TFLOP/s and ratios to each peer.
    print("\n| D | L | causal | mma bwd | det. bwd | flash bwd | cuDNN bwd | mma/flash | mma/cuDNN | wb fwd+bwd | "
          "flash fwd+bwd | cuDNN fwd+bwd | wb/flash | wb/cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in args.head_dims:
        for L in args.lengths:
            for causal in (False, True):
                t = {(r["impl"], r["pass"]): r["tflops"] for r in rows
                     if r["head_dim"] == d and r["seqlen"] == L and r["causal"] == causal}
                mb, db, fb, cb = t["mma", "bwd"], t["mma deterministic", "bwd"], t["sdpa flash", "bwd"], t[
                    "sdpa cudnn", "bwd"]
                wf, ff, cf = t["waveboost", "fwd+bwd"], t["sdpa flash", "fwd+bwd"], t["sdpa cudnn", "fwd+bwd"]
                print(f"| {d} | {L} | {causal} | {mb} | {db} | {fb} | {cb} | {mb / fb:.2f} | {mb / cb:.2f} | {wf} | "
                      f"{ff} | {cf} | {wf / ff:.2f} | {wf / cf:.2f} |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
