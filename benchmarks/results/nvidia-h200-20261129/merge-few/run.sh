#!/usr/bin/env bash
# Trees mn (main) and m2 (merge-few-128: rows of <= 8 parts in one round trip; 128-row TMA decode tiles past 128
# rows per kv head): merge_probe and decode_probe alternating first, then forward + serving checks on m2.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh mn m2 || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-m2/benchmarks
for r in 1 2; do for t in mn m2; do
  PYTHONPATH=/tmp/$t timeout 90 python3 merge_probe.py --impls waveboost --tag $t-$r >> $T/merge.jsonl 2>>$T/probe-err.txt
  PYTHONPATH=/tmp/$t timeout 90 python3 decode_probe.py --impls wb_blhd --kernels --tag $t-$r-d128 --shapes 1x32768x32x1,8x16384x32x1,32x8192x32x1,16x8192x64x1,1x2048x32x8 >> $T/probe.jsonl 2>>$T/probe-err.txt
  PYTHONPATH=/tmp/$t timeout 60 python3 decode_probe.py --impls wb_blhd --kernels --tag $t-$r-q4 --seqlen-q 4 --shapes 4x8192x32x1,1x32768x32x1 >> $T/probe.jsonl 2>>$T/probe-err.txt
done; done
for t in mn m2; do
  PYTHONPATH=/tmp/$t timeout 60 python3 decode_probe.py --impls wb_blhd --kernels --tag $t-1-q8 --seqlen-q 8 --shapes 16x8192x32x1 >> $T/probe.jsonl 2>>$T/probe-err.txt
  PYTHONPATH=/tmp/$t timeout 60 python3 decode_probe.py --impls wb_blhd --kernels --tag $t-1-q16 --seqlen-q 16 --shapes 8x8192x32x1 >> $T/probe.jsonl 2>>$T/probe-err.txt
done
echo "probed $(( $(date +%s)-t0 )) s"
python3 probe_table.py $T/probe.jsonl --base mn --new m2
python3 - <<'PY'
import json, os, statistics, collections
d = collections.defaultdict(list)
for l in open(os.environ["OUT"] + "/merge.jsonl"):
    if l.startswith("{"):
        r = json.loads(l); d[("x".join(map(str, r["shape"])), r["parts_dtype"], r["tag"].split("-")[0])].append(r)
print("| shape | parts | main us (%) | branch us (%) | main / branch |")
for (sh, dt, t) in sorted(k for k in d if k[2] == "mn"):
    a, b = d[(sh, dt, "mn")], d.get((sh, dt, "m2"), [])
    if not b: continue
    ma, mb = statistics.median(x["waveboost"] for x in a), statistics.median(x["waveboost"] for x in b)
    print(f"| {sh} | {dt} | {ma:.2f} ({a[0]['waveboost_pct']}) | {mb:.2f} ({b[0]['waveboost_pct']}) | {ma / mb:.3f} |")
PY
cd /tmp/src-m2; export PYTHONPATH=/tmp/m2
bash benchmarks/gpu_checks.sh $T/fw forward > $T/fw.sum 2>&1 &
bash benchmarks/gpu_checks.sh $T/sv serving > $T/sv.sum 2>&1 &
wait
cat $T/fw.sum $T/sv.sum
tail -2 $T/probe-err.txt
echo "total $(( $(date +%s)-t0 )) s"
