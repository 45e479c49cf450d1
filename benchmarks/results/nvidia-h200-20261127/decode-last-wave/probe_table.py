import json, sys, collections, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
d = collections.defaultdict(list); cols = []
for r in rows:
    for key in ("wb_blhd", "wb_bhld", "sdpa_cudnn"):
        if key + "_pct" in r:
            c = r["tag"] + ":" + key
            if c not in cols: cols.append(c)
            d[(tuple(r["shape"]), c)].append((r[key + "_pct"], r[key]))
print("shape | " + " | ".join(cols) + "   (% of peak per round; median us)")
for shape in dict.fromkeys(k[0] for k in d):
    cells = []
    for c in cols:
        v = d.get((shape, c), [])
        cells.append("/".join(f"{p}" for p, _ in v) + (f" {statistics.median(u for _, u in v):.2f}us" if v else ""))
    print("x".join(map(str, shape)), "|", " | ".join(cells))
