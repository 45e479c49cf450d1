# TRACE lines: block, last, then 13 %globaltimer points (ns); the launches are told apart by > 200 us gaps
# between block starts, and the last two are tabulated: us from the first block's start, min / p10 / median
# / p90 / max over the blocks. The points' names follow the patch: this folder's trace.patch by default,
# `--midtile` for the H100 folder's (point 3 the middle tile's wait, point 4 the barrier setup).
import sys, statistics
names = ["start", "seq", "qissue", "barinit", "prefetch", "issued", "tile0", "loop", "epi", "atomic", "lse", "weights",
         "merged"]
if "--midtile" in sys.argv:
    names[3:5] = ["midtile", "barinit"]
path = [a for a in sys.argv[1:] if not a.startswith("--")][0]
rows = []
for line in open(path):
    if line.startswith("TRACE"):
        f = line.split()
        rows.append((int(f[1]), int(f[2]), [int(x) for x in f[3:16]]))
rows.sort(key=lambda r: r[2][0])
groups, cur = [], []
for r in rows:
    if cur and r[2][0] - cur[-1][2][0] > 200000: groups.append(cur); cur = []
    cur.append(r)
groups.append(cur)
print(f"{len(groups)} launches, {len(groups[-1])} blocks in the last")
for gi in (-2, -1):
    g = groups[gi]
    base = min(r[2][0] for r in g)
    print(f"launch {gi}: us from the first block's start (distribution over blocks)")
    for i, n in enumerate(names):
        vals = [(r[2][i] - base) / 1e3 for r in g if r[2][i] > 0]
        if not vals: continue
        q = statistics.quantiles(vals, n=10) if len(vals) > 1 else [vals[0]] * 9
        print(f"  {n:7s} min {min(vals):6.2f} p10 {q[0]:6.2f} med {statistics.median(vals):6.2f} p90 {q[8]:6.2f} "
              f"max {max(vals):6.2f}  ({len(vals)} blocks)")
    m = [r for r in g if r[1] == 1]
    for r in m[:3]:
        print("  merger", r[0], " ".join(f"{(x - base) / 1e3:.2f}" if x else "-" for x in r[2]))
