#!/usr/bin/env bash
# Trees mn (main) and cl (combine-lse): ncu of the combine kernels on cl; forward and serving checks
# on cl; decode_probe mn / cl alternating (two rounds, --kernels), SDPA cuDNN.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT; ONE=$PWD/benchmarks/results/nvidia-h200-20261129/combine-lse/one_step.py
TARBALLS=.devrun bash benchmarks/build_trees.sh mn cl || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
R=/tmp/src-cl
for t in cl; do for sh in 1x32768x32x1 8x16384x32x1; do
  PYTHONPATH=/tmp/$t timeout 60 ncu --kernel-name regex:combine --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis python3 $ONE $sh > $T/ncu-$t-$sh.txt 2>&1
  echo "ncu $t $sh: $(grep -E '^ +Duration' $T/ncu-$t-$sh.txt | tr -s ' ')"
done; done
cd /tmp/src-cl; export PYTHONPATH=/tmp/cl
bash benchmarks/gpu_checks.sh $T/fw forward > $T/fw.sum 2>&1 &
bash benchmarks/gpu_checks.sh $T/sv serving > $T/sv.sum 2>&1 &
wait
cat $T/fw.sum $T/sv.sum
echo "checked $(( $(date +%s)-t0 )) s"
cd /tmp/src-cl/benchmarks
S1=1x32768x32x1,2x32768x32x1,1x32768x64x1,8x16384x32x1,32x8192x32x1
probe() {  # tag set extra-args...
  local tag=$1 set=$2; shift 2
  for r in 1 2; do for t in mn cl; do
    PYTHONPATH=/tmp/$t timeout 90 python3 decode_probe.py --impls wb_blhd --kernels --tag $t-$r-$tag --shapes $set "$@" >> $T/probe.jsonl 2>>$T/probe-err.txt
  done; done
}
probe d128 $S1
probe q4 4x8192x32x1,1x32768x32x1 --seqlen-q 4
probe d64 1x32768x32x1,8x16384x32x1 --head-dim 64
timeout 60 python3 decode_probe.py --impls sdpa_cudnn --tag cudnn-d128 --shapes $S1 >> $T/probe.jsonl 2>>$T/probe-err.txt
python3 /tmp/src-cl/benchmarks/probe_table.py $T/probe.jsonl --base mn --new cl
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/probe.jsonl"):
    if l.startswith("{") and "-1-" in json.loads(l)["tag"]:
        r = json.loads(l); print(r["tag"], "x".join(map(str, r["shape"])), r.get("wb_blhd"), {k[:40]: v for k, v in (r.get("wb_blhd_kernels") or {}).items()})
PY
tail -3 $T/probe-err.txt
echo "total $(( $(date +%s)-t0 )) s"
