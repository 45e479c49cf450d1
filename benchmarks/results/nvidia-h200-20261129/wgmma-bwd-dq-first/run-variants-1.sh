#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh var || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
for vv in 1 3; do
( cd /tmp/src-var && WB_BWD_VARIANT=$vv PYTHONPATH=/tmp/var timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_backward_gpu.py tests/test_backward.py -k "wgmma or auto" > /tmp/t/pytest-v$vv.log 2>&1; echo "pytest rc $?" >> /tmp/t/pytest-v$vv.log ) &
done
wait
for vv in 1 3; do echo "v$vv: $(tail -2 /tmp/t/pytest-v$vv.log | tr '\n' ' ')"; done
echo "tested $(( $(date +%s)-t0 )) s"
for run in a b; do
  PYTHONPATH=/tmp/var python3 benchmarks/ab_env.py --env WB_BWD_VARIANT --values 1,2,3 --backend wgmma --pass bwd --head-dims 64,128 --seqlens 1024,4096,16384 --rounds 15 --calls 4 > /tmp/t/abenv-$run.txt 2>&1
  echo "== run $run ($(( $(date +%s)-t0 )) s)"; grep -A20 "^# paired" /tmp/t/abenv-$run.txt
done
tar czf $OUT/c9.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
