"""Time settings of one build against each other in one process: an environment variable that the library reads
at each call (e.g. WAVEBOOST_WGMMA_BACKWARD) takes each of its values in turn, batch after batch, so that clock
and thermal drift between processes (which moved whole A/B rounds by 8-18% on one H200) falls on every setting
alike. For each FA2-grid cell: `--rounds` rounds; in each, every value (in an order rotated per round) times
`--calls` back-to-back calls between two CUDA events.

    python benchmarks/ab_env.py --env NAME --values A,B[,C...] --backend wgmma --pass bwd [--dtypes bf16]
                                [--head-dims 64,128] [--seqlens 1024,4096] [--causal both] [--rounds 15] [--calls 4]

Prints, per round and value, `NAME=VALUE pass backend dtype D L causal ms_per_call` (the line format of
benchmarks/ab_time.py, so benchmarks/ab_table.py reads it), then per cell the median over rounds of the paired
ratio (first value's time / each other value's, from the same round: > 1, that value faster) and its range.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics

import torch

from ab_time import add_cell_arguments, fa2_cells  # this script's folder


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", required=True)
    ap.add_argument("--values", required=True, help="comma-separated; the first is the base of the ratios")
    add_cell_arguments(ap)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--out", default=None, help="also append the per-round lines to this file")
    args = ap.parse_args(argv)
    values = args.values.split(",")
    sink = open(args.out, "a") if args.out else None
    summary = []
    for cell, run in fa2_cells(args):
        for value in values:
            os.environ[args.env] = value
            for _ in range(2):
                run()
        torch.cuda.synchronize()
        times = {value: [] for value in values}
        for r in range(args.rounds):
            order = values[r % len(values):] + values[:r % len(values)]
            for value in order:
                os.environ[args.env] = value
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.calls):
                    run()
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end) / args.calls
                times[value].append(ms)
                line = f"{args.env}={value} {cell} {ms:.4f}"
                print(line, flush=True)
                if sink:
                    print(line, file=sink, flush=True)
        ratios = []  # per other value: (median, min, max) of the paired ratios
        for value in values[1:]:
            paired = sorted(a / c for a, c in zip(times[values[0]], times[value]))
            ratios.append((statistics.median(paired), paired[0], paired[-1]))
        summary.append((cell, [statistics.median(times[v]) for v in values], ratios))
    os.environ.pop(args.env, None)
    print(f"# paired ratios, median over {args.rounds} rounds [min, max]; ms medians in the order {values}")
    for cell, medians, ratios in summary:
        print(f"{cell} | " + " ".join(f"{m:.4f}" for m in medians) + " | " +
              " | ".join(f"{values[0]}/{v} {med:.3f} [{lo:.3f}, {hi:.3f}]" for v, (med, lo, hi) in zip(values[1:], ratios)))
    for i, value in enumerate(values[1:]):
        logs = [math.log(ratios[i][0]) for _, _, ratios in summary]
        print(f"geomean {values[0]}/{value}: {math.exp(sum(logs) / len(logs)):.4f} over {len(logs)} cells")

if __name__ == "__main__":
    main()
