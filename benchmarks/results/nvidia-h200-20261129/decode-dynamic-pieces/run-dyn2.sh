#!/usr/bin/env bash
# Tree: branch decode-dynamic. The dynamic pieces on the usual (batch, L, heads_kv, D) cache and on head-major
# storage (each head's keys contiguous), switch off / on in alternating processes, two rounds.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh dyn || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-dyn/benchmarks
export PYTHONPATH=/tmp/dyn
S=1x32768x32x8,4x8192x32x8,8x16384x32x8,1x131072x32x8
for r in 1 2; do
  WAVEBOOST_DECODE_DYNAMIC=0 python3 decode_probe.py --impls wb_blhd,wb_bhld --tag off$r --shapes $S >> /tmp/t/layout.jsonl 2>/tmp/t/err.txt
  python3 decode_probe.py --impls wb_blhd,wb_bhld --tag on$r --shapes $S >> /tmp/t/layout.jsonl 2>>/tmp/t/err.txt
done
echo "probes $(( $(date +%s)-t0 )) s"
python3 - <<'PY'
import json, collections, statistics
rows = [json.loads(l) for l in open("/tmp/t/layout.jsonl") if l.startswith("{")]
d = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    for key in ("wb_blhd", "wb_bhld"):
        d[(tuple(r["shape"]), key)][r["tag"][:-1]].append((r[key], r[key + "_pct"]))
print("shape | layout | off us (pct) | on us (pct) | off/on per round")
for (s, key), v in d.items():
    off, on = v["off"], v["on"]
    print(f"{'x'.join(map(str, s))} | {key} | {statistics.median(u for u, _ in off):.1f} ({'/'.join(str(p) for _, p in off)}) | "
          f"{statistics.median(u for u, _ in on):.1f} ({'/'.join(str(p) for _, p in on)}) | "
          + " ".join(f"{a[0] / b[0]:.3f}" for a, b in zip(off, on)))
PY
tail -3 /tmp/t/err.txt
tar czf $OUT/dyn2.tgz -C /tmp/t .
