#!/bin/bash
# $TARBALLS: a folder with `git archive` tarballs of the trees compared (<name>.tgz). Run from the repository root.
# base = exp-force-splits without its switch (the split rule before 9569424), main (9569424 rule), br-fill (fill rule).
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
bash benchmarks/build_trees.sh exp main br-fill
(cd /tmp/src-br-fill && PYTHONPATH=/tmp/br-fill timeout 200 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py > /tmp/logs/pytest-br.txt 2>&1; echo "br pytest rc $?"; tail -1 /tmp/logs/pytest-br.txt; grep "^FAILED" /tmp/logs/pytest-br.txt | head -5)
SH=20x8192x32x8,24x8192x32x8,17x16384x32x8,34x4096x32x8,40x4096x32x8,48x4096x32x8,80x4096x32x8,72x2048x32x8,128x2048x32x8
for r in 1 2; do for n in exp main br-fill; do
  PYTHONPATH=/tmp/$n timeout 120 python3 benchmarks/decode_probe.py --tag $n --impls wb_blhd --shapes $SH >> /tmp/logs/dense.jsonl 2>>/tmp/logs/probe-err.txt
done; done
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/dense.jsonl | tee $OUT/dense.txt
SP=20x8192x32x8,17x16384x32x8,34x4096x32x8,40x4096x32x8,48x4096x32x8,72x2048x32x8,36x2048x64x8,128x2048x32x8
for r in 1 2; do for n in exp br-fill; do
  PYTHONPATH=/tmp/$n timeout 120 python3 benchmarks/decode_probe.py --tag p16-$n --page-size 16 --impls wb_blhd --shapes $SP >> /tmp/logs/paged.jsonl 2>>/tmp/logs/probe-err.txt
done; done
tail -3 /tmp/logs/probe-err.txt
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/paged.jsonl | tee $OUT/paged.txt
cp /tmp/logs/*.jsonl /tmp/logs/pytest-br.txt $OUT/
