# TRACE lines: block last t0..t6 (ns, globaltimer); the last launch (t0 clusters split by > 200 us gaps)
import sys, statistics
rows = []
for line in open(sys.argv[1]):
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
    names = ["start", "seq", "qissue", "midtile", "barinit", "issued", "tile0", "loop", "epi", "atomic", "lse", "weights", "merged"]
    print(f"launch {gi}: us from the first block's start (distribution over blocks)")
    for i, n in enumerate(names):
        vals = [(r[2][i] - base) / 1e3 for r in g if r[2][i] > 0]
        if vals: q = statistics.quantiles(vals, n=10) if len(vals) > 1 else [vals[0]] * 9
        print(f"  {n:7s} min {min(vals):6.2f} p10 {q[0]:6.2f} med {statistics.median(vals):6.2f} p90 {q[8]:6.2f} max {max(vals):6.2f}  ({len(vals)} blocks)")
    m = [r for r in g if r[1] == 1]
    for r in m[:3]:
        print("  merger", r[0], " ".join(f"{(x - base) / 1e3:.2f}" if x else "-" for x in r[2]))
