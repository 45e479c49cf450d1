#!/usr/bin/env bash
# Tree: branch meas-d64-rows (WAVEBOOST_WGMMA_D64_ROWS read per call). Causal head dim 64 from 2304 rows:
# 192-row blocks (main's rule, value 192) against 64-row blocks over 64-key tiles, three per SM (64).
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh rows || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-rows
PYTHONPATH=/tmp/rows timeout 120 python3 benchmarks/ab_env.py --env WAVEBOOST_WGMMA_D64_ROWS --values 192,64 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 64 --causal 1 --seqlens 3072,4096,8192 --rounds 6 --calls 3 > /tmp/t/abenv-rows.txt 2>&1
grep -A10 "^# paired" /tmp/t/abenv-rows.txt
echo "total $(( $(date +%s)-t0 )) s"
tar czf $OUT/rows.tgz -C /tmp/t .
