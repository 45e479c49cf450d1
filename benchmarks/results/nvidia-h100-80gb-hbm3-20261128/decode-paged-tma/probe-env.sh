#!/bin/bash
# H100 paged decode: which wave/pipeline suits paged caches (env only, main tree)
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/main -Cbuild-dir=/tmp/build-main . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { tail -30 /tmp/logs/build.log; exit 1; }
SH=16x8192x32x8,8x8192x32x8,1x32768x32x8,34x4096x32x8,64x4096x64x8,128x2048x32x8
for r in 1 2; do
  PYTHONPATH=/tmp/main timeout 60 python3 benchmarks/decode_probe.py --tag dense --impls wb_blhd --shapes $SH >> /tmp/logs/probe.jsonl 2>>/tmp/logs/err.txt
  for pg in 16 256; do
    PYTHONPATH=/tmp/main timeout 60 python3 benchmarks/decode_probe.py --tag p$pg-def --page-size $pg --impls wb_blhd --shapes $SH >> /tmp/logs/probe.jsonl 2>>/tmp/logs/err.txt
    WAVEBOOST_DECODE_BLOCKS_PER_SM=2 PYTHONPATH=/tmp/main timeout 60 python3 benchmarks/decode_probe.py --tag p$pg-bps2 --page-size $pg --impls wb_blhd --shapes $SH >> /tmp/logs/probe.jsonl 2>>/tmp/logs/err.txt
    WAVEBOOST_DECODE_PIPELINE=tma PYTHONPATH=/tmp/main timeout 60 python3 benchmarks/decode_probe.py --tag p$pg-tma --page-size $pg --impls wb_blhd --shapes $SH >> /tmp/logs/probe.jsonl 2>>/tmp/logs/err.txt
    WAVEBOOST_DECODE_PIPELINE=tma WAVEBOOST_DECODE_BLOCKS_PER_SM=2 PYTHONPATH=/tmp/main timeout 60 python3 benchmarks/decode_probe.py --tag p$pg-tma-bps2 --page-size $pg --impls wb_blhd --shapes $SH >> /tmp/logs/probe.jsonl 2>>/tmp/logs/err.txt
  done
done
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/probe.jsonl | tee $OUT/probe.txt
cp /tmp/logs/probe.jsonl /tmp/logs/err.txt $OUT/
