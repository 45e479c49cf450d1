#!/usr/bin/env bash
# Trees mn (main) and nx (decode-next: the one-warp combine bound, 64-row TMA decode tiles, 16-bit parts' loads):
# forward and serving checks on nx side by side; decode_probe mn / nx alternating (two rounds, --kernels);
# SDPA cuDNN. Prepare: rm -f .devrun/*.tgz; git archive main | gzip > .devrun/mn.tgz;
# git archive decode-next | gzip > .devrun/nx.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh mn nx || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-nx; export PYTHONPATH=/tmp/nx
bash benchmarks/gpu_checks.sh $T/fw forward > $T/fw.sum 2>&1 &
bash benchmarks/gpu_checks.sh $T/sv serving > $T/sv.sum 2>&1 &
wait
cat $T/fw.sum $T/sv.sum
echo "checked $(( $(date +%s)-t0 )) s"
cd /tmp/src-nx/benchmarks
probe() {  # tag set extra-args...
  local tag=$1 set=$2; shift 2
  for r in 1 2; do for t in mn nx; do
    PYTHONPATH=/tmp/$t timeout 90 python3 decode_probe.py --impls wb_blhd --kernels --tag $t-$r-$tag --shapes $set "$@" >> $T/probe.jsonl 2>>$T/probe-err.txt
  done; done
}
S1=1x32768x32x1,1x32768x64x1,2x32768x64x1,8x16384x32x1,32x8192x32x1,16x8192x64x1,16x8192x32x8
probe d128 $S1
probe q4 4x8192x32x1,1x32768x32x1 --seqlen-q 4
probe q8 16x8192x64x4,16x8192x32x4 --seqlen-q 8
probe d64 1x32768x64x1 --head-dim 64
probe p16 1x32768x64x1 --page-size 16
for r in 1 2; do for t in mn nx; do
  PYTHONPATH=/tmp/$t timeout 60 python3 merge_probe.py --impls waveboost --tag $t-$r >> $T/merge.jsonl 2>>$T/probe-err.txt
done; done
PYTHONPATH=/tmp/mn timeout 60 python3 merge_probe.py --impls torch --tag torch >> $T/merge.jsonl 2>>$T/probe-err.txt
timeout 60 python3 decode_probe.py --impls sdpa_cudnn --tag cudnn-d128 --shapes $S1 >> $T/probe.jsonl 2>>$T/probe-err.txt
python3 /tmp/src-nx/benchmarks/probe_table.py $T/probe.jsonl --base mn --new nx
python3 - <<'PY'
import json, os, statistics, collections
d = collections.defaultdict(list)
for l in open(os.environ["OUT"] + "/merge.jsonl"):
    if l.startswith("{"):
        r = json.loads(l); d[("x".join(map(str, r["shape"])), r["parts_dtype"], r["tag"].split("-")[0])].append(r)
tq = {("x".join(map(str, r["shape"])), r["parts_dtype"]): r for rs in d.values() for r in rs if "torch" in r}
print("| shape | parts | main us (%) | branch us (%) | main / branch | torch us (%) |")
for (sh, dt, t) in sorted(k for k in d if k[2] == "mn"):
    a, b = d[(sh, dt, "mn")], d.get((sh, dt, "nx"), [])
    if not b: continue
    ma, mb = statistics.median(x["waveboost"] for x in a), statistics.median(x["waveboost"] for x in b)
    print(f"| {sh} | {dt} | {ma:.2f} ({a[0]['waveboost_pct']}) | {mb:.2f} ({b[0]['waveboost_pct']}) | {ma / mb:.3f} | {tq.get((sh, dt), {}).get('torch', 0):.2f} ({tq.get((sh, dt), {}).get('torch_pct')}) |")
PY
tail -3 $T/probe-err.txt
echo "total $(( $(date +%s)-t0 )) s"
