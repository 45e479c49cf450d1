import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = collections.Counter()
allS = 0
for r in data:
    if len(r) < len(hdr): continue
    for h in reasons: tot[h] += int(r[ix[h]] or 0)
    allS += int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
print("total samples", allS, "instructions", len(data))
for h, v in tot.most_common(12): print(f"  {h:28s} {v:6d} {100*v/allS:5.1f}%")
# top instructions
top = sorted(data, key=lambda r: -int(r[ix["Warp Stall Sampling (All Samples)"]] or 0) if len(r) >= len(hdr) else 0)[:int(sys.argv[2]) if len(sys.argv) > 2 else 25]
for r in top:
    n = int(r[ix["Warp Stall Sampling (All Samples)"]])
    rs = sorted(((int(r[ix[h]] or 0), h[6:]) for h in reasons), reverse=True)[:3]
    print(f"{r[0][-5:]} {n:5d} {r[1].strip()[:60]:60s} " + " ".join(f"{h}:{v}" for v, h in rs if v))
