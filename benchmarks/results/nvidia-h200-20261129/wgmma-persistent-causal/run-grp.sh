#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh grp || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-grp
WB_FWD_VARIANT=2 PYTHONPATH=/tmp/grp timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_wgmma_pipeline.py tests/test_registry.py > /tmp/t/pytest-v2.log 2>&1; echo "v2 pytest rc $? $(tail -1 /tmp/t/pytest-v2.log)"
for run in a b; do
PYTHONPATH=/tmp/grp python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1,2 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 128 --causal 1 --seqlens 2048,4096,8192,16384,32768 --rounds 8 --calls 2 > /tmp/t/abenv-$run.txt 2>&1
grep -A14 "^# paired" /tmp/t/abenv-$run.txt
echo "== $(( $(date +%s)-t0 )) s"
done
tar czf $OUT/grp.tgz -C /tmp/t .
