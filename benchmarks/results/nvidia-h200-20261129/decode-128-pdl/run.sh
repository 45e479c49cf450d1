#!/usr/bin/env bash
# Trees nx (decode-next), n1 (decode-next-128) and pd (decode-next-pdl): decode_probe alternating first (timing on
# an idle GPU), then serving checks on n1 and pd side by side. Prepare: rm -f .devrun/*.tgz; git archive
# decode-next | gzip > .devrun/nx.tgz; ... decode-next-128 > n1.tgz; decode-next-pdl > pd.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh nx n1 pd || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-nx/benchmarks
probe() {  # tag rounds set extra-args...
  local tag=$1 rounds=$2 set=$3; shift 3
  for r in $(seq $rounds); do for t in nx n1 pd; do
    PYTHONPATH=/tmp/$t timeout 90 python3 decode_probe.py --impls wb_blhd --kernels --tag $t-$r-$tag --shapes $set "$@" >> $T/probe.jsonl 2>>$T/probe-err.txt
  done; done
}
probe d128 2 1x32768x32x1,1x32768x64x1,8x16384x32x1,32x8192x32x1,1x2048x32x8,16x8192x32x8
probe q4 2 4x8192x32x1,1x32768x32x1 --seqlen-q 4
probe q8 1 16x8192x32x1,16x8192x32x4 --seqlen-q 8
probe q16 1 8x8192x32x1 --seqlen-q 16
echo "probed $(( $(date +%s)-t0 )) s"
python3 probe_table.py $T/probe.jsonl --base nx --new n1
python3 probe_table.py $T/probe.jsonl --base nx --new pd
for t in n1 pd; do
  ( cd /tmp/src-$t && PYTHONPATH=/tmp/$t bash benchmarks/gpu_checks.sh $T/sv-$t serving > $T/sv-$t.sum 2>&1 ) &
done
wait
for t in n1 pd; do echo "== $t"; cat $T/sv-$t.sum; done
tail -3 $T/probe-err.txt
echo "total $(( $(date +%s)-t0 )) s"
