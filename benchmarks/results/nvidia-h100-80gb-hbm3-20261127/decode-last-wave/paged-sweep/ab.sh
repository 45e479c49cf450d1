#!/bin/bash
# $TARBALLS: a folder with `git archive` tarballs of the trees compared (<name>.tgz). Run from the repository root.
# H100: dense A/B of the last-wave rule (main) against the old rule (exp-force-splits without its switch);
# paged caches (pages of 16 and 64 keys) under forced piece counts.
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
bash benchmarks/build_trees.sh main exp
SH=20x8192x32x8,24x8192x32x8,17x16384x32x8,34x4096x32x8,40x4096x32x8,48x4096x32x8,128x2048x32x8
for r in 1 2; do for n in exp main; do
  PYTHONPATH=/tmp/$n timeout 120 python3 benchmarks/decode_probe.py --tag $n --impls wb_blhd --shapes $SH >> /tmp/logs/dense.jsonl 2>>/tmp/logs/probe-err.txt
done; done
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/dense.jsonl | tee $OUT/dense.txt
SW=20x8192x32x8,17x16384x32x8,34x4096x32x8,40x4096x32x8,48x4096x32x8,128x2048x32x8
for ps in 16 64; do for fs in 1 2 3 4; do
  WAVEBOOST_DECODE_FORCE_SPLITS=$fs PYTHONPATH=/tmp/exp timeout 120 python3 benchmarks/decode_probe.py --tag p${ps}fs$fs --page-size $ps --impls wb_blhd --shapes $SW >> /tmp/logs/paged.jsonl 2>>/tmp/logs/probe-err.txt
done; done
tail -3 /tmp/logs/probe-err.txt
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/paged.jsonl | tee $OUT/paged.txt
cp /tmp/logs/*.jsonl $OUT/
