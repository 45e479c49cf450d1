#!/bin/bash
# $TARBALLS: a folder with `git archive` tarballs of the trees compared (<name>.tgz). Run from the repository root.
# A/B of main against decode-merge-two-items (br-2i) and decode-pdl (br-pdl): tests + sanitizers per branch, probe.
# Tarballs: git archive <rev> | gzip > "$TARBALLS"/<name>.tgz (base = main, br-2i, br-pdl). Run on an H200, then an H100.
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
bash benchmarks/build_trees.sh base br-2i br-pdl
for n in br-2i br-pdl; do
  test -d /tmp/$n/waveboost || { echo "$n build failed"; tail -20 /tmp/logs/build-$n.log; continue; }
  (cd /tmp/src-$n && PYTHONPATH=/tmp/$n timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py > /tmp/logs/pytest-$n.txt 2>&1; echo "$n pytest rc $?"; tail -1 /tmp/logs/pytest-$n.txt; grep "^FAILED" /tmp/logs/pytest-$n.txt | head -5)
  for t in memcheck racecheck synccheck; do
  (cd /tmp/src-$n && PYTHONPATH=/tmp/$n timeout 90 compute-sanitizer --tool $t python3 tests/sanitize/run_cases.py --serving-only > /tmp/logs/$t-$n.log 2>&1; echo "$n $t rc $?"; tail -1 /tmp/logs/$t-$n.log)
  done
done
SH=1x2048x32x8,1x32768x32x8,16x8192x32x8,128x2048x32x8,32x8192x32x1,1x2048x64x8,1x4096x64x8,1x32768x64x8,64x4096x64x8
for r in 1 2; do for n in base br-2i br-pdl; do
  test -d /tmp/$n/waveboost && PYTHONPATH=/tmp/$n timeout 60 python3 benchmarks/decode_probe.py --tag $n --impls wb_blhd,sdpa_cudnn --shapes $SH >> /tmp/logs/probe.jsonl 2>>/tmp/logs/probe-err.txt
done; done
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/probe.jsonl | tee $OUT/probe.txt
tar czf $OUT/logs.tgz -C /tmp logs
