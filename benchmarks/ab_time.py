"""Time one backend's forward or backward on the FA2 grid with only the stable API (attention,
attention_backward), so that the same script times two builds of waveboost against each other
(benchmarks/ab_trees.sh imports each build in turn through PYTHONPATH).

    python benchmarks/ab_time.py TAG --backend mma --pass bwd [--dtypes bf16,fp16,e4m3] [--head-dims 64,128]
                                     [--seqlens 1024,4096] [--causal 0|1|both] [--repeats 20] [--deterministic]

Prints one line per cell: TAG pass backend dtype D L causal median_ms (CUDA events, after 3 warm-up calls,
random normal inputs; batch = 16384 / L, heads = 2048 / D). e4m3 (float8_e4m3fn q, k, v; forward only, head dim
128, the wgmma backend's FP8 kernel with unit descales) skips the other head dims.
"""
from __future__ import annotations

import argparse

import torch

import waveboost

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "e4m3": getattr(torch, "float8_e4m3fn", None)}


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def fa2_cell_call(which: str, backend: str, dtype, head_dim: int, seqlen: int, causal: bool,
                  deterministic: bool = False, device: str = "cuda"):
    """A call of one FA2-grid cell (batch = 16384 / L, heads = 2048 / D, random normal inputs seeded by the
    cell): the forward, or the backward from the forward's saved outputs. Returns the function to time."""
    b, h = max(1, 16384 // seqlen), max(1, 2048 // head_dim)
    g = torch.Generator(device=device).manual_seed(seqlen * 1000 + head_dim)

    def mk():
        return torch.randn(b, seqlen, h, head_dim, generator=g, device=device).to(dtype)
    q, k, v, dout = mk(), mk(), mk(), mk()
    if which == "fwd":
        return lambda: waveboost.attention(q, k, v, causal=causal, backend=backend)
    out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True)
    return lambda: waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                                deterministic=deterministic, backend=backend)


def add_cell_arguments(ap: argparse.ArgumentParser) -> None:
    """The options that name FA2-grid cells and the call timed in each (fa2_cells)."""
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--pass", dest="which", choices=["fwd", "bwd"], default="fwd")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--head-dims", type=ints, default=[64, 128])
    ap.add_argument("--seqlens", type=ints, default=[1024, 4096])
    ap.add_argument("--deterministic", action="store_true", help="backward with deterministic=True")
    ap.add_argument("--causal", choices=("0", "1", "both"), default="both",
                    help="0: the non-causal cells, 1: the causal ones, both (default)")


def fa2_cells(args):
    """(label, call) per cell the options of add_cell_arguments name, each call made (its inputs
    allocated) when its cell comes; label: `pass backend dtype D L causal`. e4m3 cells other than
    the forward at head dim 128 are skipped."""
    which = args.which + ("-det" if args.deterministic else "")
    for dname in args.dtypes.split(","):
        for d in args.head_dims:
            for causal in {"0": (False,), "1": (True,), "both": (False, True)}[args.causal]:
                for L in args.seqlens:
                    if dname == "e4m3" and (d != 128 or args.which != "fwd"):
                        continue
                    yield (f"{which} {args.backend} {dname} {d} {L} {int(causal)}",
                           fa2_cell_call(args.which, args.backend, DTYPES[dname], d, L, causal, args.deterministic))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tag")
    add_cell_arguments(ap)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    for cell, run in fa2_cells(args):
        for _ in range(3):
            run()
        times = []
        for _ in range(args.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        print(f"{args.tag} {cell} {times[len(times) // 2]:.4f}", flush=True)


if __name__ == "__main__":
    main()
