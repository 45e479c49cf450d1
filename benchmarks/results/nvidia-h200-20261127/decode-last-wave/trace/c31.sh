#!/bin/bash
# $TARBALLS: a folder with `git archive` tarballs of the trees compared (<name>.tgz). Run from the repository root.
# H200: block trace (buffer) of main's TMA decode kernel on the large cells and batch 1.
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/src-trace && tar xzf "$TARBALLS"/main.tgz -C /tmp/src-trace
(P=$PWD/benchmarks/results/nvidia-h200-20261127/decode-last-wave/trace/blocktrace.patch; cd /tmp/src-trace && (patch -p1 -s < $P || git apply $P)) || echo "patch failed"
python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/trace -Cbuild-dir=/tmp/build-trace /tmp/src-trace -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build-trace.log 2>&1 || tail -20 /tmp/logs/build-trace.log
S=128x2048x32x8,64x4096x64x8,16x8192x32x8,32x8192x32x1,1x32768x32x8,1x2048x32x8
PYTHONPATH=/tmp/trace timeout 120 python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/trace/bt_run.py $S > /tmp/logs/bt.txt 2>/tmp/logs/bt-err.txt; echo "bt rc $?"; tail -3 /tmp/logs/bt-err.txt
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/trace/bt_tab.py /tmp/logs/bt.txt | tee $OUT/bt.txt
WAVEBOOST_DECODE_BLOCKS_PER_SM=1 PYTHONPATH=/tmp/trace timeout 120 python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/trace/bt_run.py 128x2048x32x8,64x4096x64x8 > /tmp/logs/bt1.txt 2>>/tmp/logs/bt-err.txt; echo "bt1 rc $?"
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/trace/bt_tab.py /tmp/logs/bt1.txt | tee $OUT/bt1.txt
gzip -c /tmp/logs/bt.txt > $OUT/bt-raw.txt.gz; gzip -c /tmp/logs/bt1.txt > $OUT/bt1-raw.txt.gz
