#!/usr/bin/env bash
# Tree n192 (branch fp8-n192): e4m3 192-key tiles, 1: as the rules place them (persistent or not), 2: one block per query block.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh n192 || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-n192; export PYTHONPATH=/tmp/n192
( WB_FWD_VARIANT=2 timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_fp8_gpu.py > $T/pytest-v2.log 2>&1; echo "rc $?" >> $T/pytest-v2.log )
echo "pytest v2: $(grep -E 'passed|failed|error' $T/pytest-v2.log | tail -2 | tr '\n' ' ')"
timeout 300 python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1,2 --backend wgmma --pass fwd --dtypes e4m3 --head-dims 128 --causal both --seqlens 1024,2048,4096,8192,16384 --rounds 6 --calls 4 > $T/abenv2.txt 2>&1
grep -A16 "^# paired" $T/abenv2.txt
echo "total $(( $(date +%s)-t0 )) s"
