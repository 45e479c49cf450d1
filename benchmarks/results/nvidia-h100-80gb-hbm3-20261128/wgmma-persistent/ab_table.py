"""The A/B table of benchmarks/ab_time.py lines (TAG pass backend dtype D L causal ms), several runs per
tag: per cell the median ms of each tag, and the first tag's median over each other's (> 1: that one faster).

    python ab_table.py ab.txt
"""
import collections
import statistics
import sys

d = collections.defaultdict(list)
tags = []
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) < 8:
        continue
    d[(tuple(p[1:-1]), p[0])].append(float(p[-1]))
    if p[0] not in tags:
        tags.append(p[0])
print("cell | " + " | ".join(f"{t} ms" for t in tags) + " | " + " | ".join(f"{tags[0]}/{t}" for t in tags[1:]))
for c in dict.fromkeys(k[0] for k in d):
    med = [statistics.median(d[(c, t)]) if d.get((c, t)) else float("nan") for t in tags]
    print(" ".join(c), "| " + " | ".join(f"{m:.4f}" for m in med) + " | " + " | ".join(f"{med[0] / m:.3f}" for m in med[1:]))
