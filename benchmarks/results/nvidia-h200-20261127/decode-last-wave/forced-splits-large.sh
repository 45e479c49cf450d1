#!/bin/bash
# $TARBALLS: a folder with `git archive` tarballs of the trees compared (<name>.tgz). Run from the repository root.
# Forced split counts on large decode cells (branch exp-force-splits): does cutting items finer shorten the tail?
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/src-exp && tar xzf "$TARBALLS"/exp.tgz -C /tmp/src-exp
python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/exp -Cbuild-dir=/tmp/build-exp /tmp/src-exp -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build-exp.log 2>&1 || tail -20 /tmp/logs/build-exp.log
SH=128x2048x32x8,64x4096x64x8,16x8192x32x8,40x4096x32x8,48x4096x32x8,32x8192x32x1
for r in 1 2; do for fs in 0 2 3 4; do
  IM=wb_blhd; [ $fs = 0 ] && IM=wb_blhd,sdpa_cudnn
  WAVEBOOST_DECODE_FORCE_SPLITS=$fs PYTHONPATH=/tmp/exp timeout 100 python3 benchmarks/decode_probe.py --tag fs$fs --impls $IM --shapes $SH >> /tmp/logs/probe.jsonl 2>>/tmp/logs/probe-err.txt
done; done
tail -3 /tmp/logs/probe-err.txt
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/probe.jsonl | tee $OUT/probe.txt
cp /tmp/logs/probe.jsonl $OUT/
