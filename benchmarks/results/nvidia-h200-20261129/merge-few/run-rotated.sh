#!/usr/bin/env bash
# Trees mn (main), mf (merge-few), m2 (merge-few-128): decode_probe on cells whose kernels did not change, three
# rounds with the order rotated.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh mn mf m2 || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-m2/benchmarks
r=0
for order in "mn mf m2" "mf m2 mn" "m2 mn mf"; do r=$((r+1)); for t in $order; do
  PYTHONPATH=/tmp/$t timeout 40 python3 decode_probe.py --impls wb_blhd --tag $t-$r-d128 --shapes 1x2048x32x8,8x16384x32x1,32x8192x32x1 >> $T/probe.jsonl 2>>$T/probe-err.txt
done; done
python3 probe_table.py $T/probe.jsonl --base mn --new mf
python3 probe_table.py $T/probe.jsonl --base mn --new m2
echo "total $(( $(date +%s)-t0 )) s"
