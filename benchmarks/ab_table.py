"""The table of an A/B run of benchmarks/ab_time.py: lines `TAG pass backend dtype D L causal ms`, several runs
per tag (builds, or settings of one build). Per cell the median ms of each tag, the first tag's median over
each other tag's (> 1: that one faster) and the same ratio of the best rounds; then their geomeans.

    python benchmarks/ab_table.py ab.txt
"""
from __future__ import annotations

import math
import statistics
import sys


def main(path: str) -> None:
    times: dict[tuple[str, tuple[str, ...]], list[float]] = {}
    tags: list[str] = []
    cells: list[tuple[str, ...]] = []
    for line in open(path):
        words = line.split()
        if len(words) < 8:
            continue
        tag, cell, ms = words[0], tuple(words[1:-1]), float(words[-1])
        times.setdefault((tag, cell), []).append(ms)
        if tag not in tags:
            tags.append(tag)
        if cell not in cells:
            cells.append(cell)
    base, others = tags[0], tags[1:]
    print("pass backend dtype D L causal | " + " | ".join(f"{t} ms" for t in tags) + " (medians) | " +
          " | ".join(f"{base} / {t}" for t in others) + " | of the best rounds")
    med = {t: [] for t in others}
    best = {t: [] for t in others}
    for c in cells:
        runs = [times.get((t, c)) for t in tags]
        if not all(runs):
            continue
        medians = [statistics.median(r) for r in runs]
        for t, r, m in zip(others, runs[1:], medians[1:]):
            med[t].append(medians[0] / m)
            best[t].append(min(runs[0]) / min(r))
        print(" ".join(c), "| " + " | ".join(f"{m:.4f}" for m in medians) + " | " +
              " | ".join(f"{med[t][-1]:.3f}" for t in others) + " | " + " | ".join(f"{best[t][-1]:.3f}" for t in others))

    def geo(r: list[float]) -> float:
        return math.exp(sum(map(math.log, r)) / len(r))

    for t in others:
        if med[t]:
            print(f"{base} / {t}: medians geomean {geo(med[t]):.4f}, min {min(med[t]):.3f}, max {max(med[t]):.3f} over "
                  f"{len(med[t])} cells; best rounds geomean {geo(best[t]):.4f}, min {min(best[t]):.3f}, "
                  f"max {max(best[t]):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
