"""waveboost (backend "cpu") against torch's CPU scaled_dot_product_attention, fp32.

The two are timed interleaved (waveboost, torch, waveboost, torch, ...) so that load from other
processes on a shared machine hits both alike; each cell reports medians over --rounds rounds of
--reps calls each, GFLOP/s (4 B H L^2 D, halved for causal) and the ratio torch / waveboost of the
median times. Both read the same (batch, seqlen, heads, head_dim) storage; torch gets the
(batch, heads, seqlen, head_dim) views, as in `python -m waveboost.bench`.

  WAVEBOOST_NUM_THREADS=2 python benchmarks/cpu_avx2_bench.py --threads 2 [--csv out.csv]
"""
import argparse
import csv
import os
import statistics
import sys
import time

import numpy as np
import torch

import waveboost
from waveboost.bench.report import cpu_name

SHAPES = [  # (batch, heads, seqlen, head_dim)
    (1, 8, 2048, 128),
    (1, 8, 1024, 64),
    (1, 4, 4096, 128),
]


def time_call(fn, reps: int) -> float:
    """Median seconds of `reps` calls."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per cell")
    ap.add_argument("--reps", type=int, default=3, help="calls per round (median taken)")
    ap.add_argument("--shapes", default="all", help="'all' or indices into SHAPES, e.g. 0")
    ap.add_argument("--causal", default="both", choices=["0", "1", "both"])
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()

    if os.environ.get("WAVEBOOST_NUM_THREADS") != str(args.threads):
        print(f"note: WAVEBOOST_NUM_THREADS={os.environ.get('WAVEBOOST_NUM_THREADS')} (set it to {args.threads} "
              "before the first call for an equal comparison)", file=sys.stderr)
    torch.set_num_threads(args.threads)
    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    causals = [False, True] if args.causal == "both" else [args.causal == "1"]
    isa = waveboost.info()["cpu_isa"]  # the CPU path waveboost runs (avx512, avx2 or baseline)
    print(f"# {cpu_name()}, {isa}, {args.threads} threads, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# {' '.join(sys.argv)}")
    header = ["batch", "heads", "seqlen", "head_dim", "causal", "wb_ms", "torch_ms", "wb_gflops", "torch_gflops",
              "ratio", "ratio_min", "ratio_max", "max_rel_err"]
    print(" ".join(f"{h:>11}" for h in header))
    rows = []
    rng = np.random.default_rng(0)
    for (b, h, l, d) in shapes:
        q, k, v = (torch.from_numpy(rng.standard_normal((b, l, h, d), dtype=np.float32)) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        for causal in causals:
            def run_wb():
                return waveboost.attention(q, k, v, causal=causal, backend="cpu")

            def run_torch():
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            ref = run_torch().transpose(1, 2)
            out = run_wb()
            err = float((out.double() - ref.double()).abs().max() / ref.double().abs().max())
            run_wb(), run_torch()  # warm-up
            wb_t, th_t = [], []
            for _ in range(args.rounds):
                wb_t.append(time_call(run_wb, args.reps))
                th_t.append(time_call(run_torch, args.reps))
            flops = 4.0 * b * h * l * l * d * (0.5 if causal else 1.0)
            wb_med, th_med = statistics.median(wb_t), statistics.median(th_t)
            ratios = [t / w for w, t in zip(wb_t, th_t)]
            row = [b, h, l, d, int(causal), wb_med * 1e3, th_med * 1e3, flops / wb_med / 1e9, flops / th_med / 1e9,
                   th_med / wb_med, min(ratios), max(ratios), err]
            rows.append(row)
            print(" ".join(f"{x:>11.4g}" if isinstance(x, float) else f"{x:>11}" for x in row), flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["# cpu", cpu_name(), "isa", isa, "threads", args.threads, "torch", torch.__version__,
                        "date", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())])
            w.writerow(["# command", " ".join(sys.argv)])
            w.writerow(header)
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
