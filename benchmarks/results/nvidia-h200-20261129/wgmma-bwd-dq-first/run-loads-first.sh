#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh var || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
for vv in 7; do
( cd /tmp/src-var && WB_BWD_VARIANT=$vv PYTHONPATH=/tmp/var timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_backward_gpu.py tests/test_backward.py > /tmp/t/pytest-v$vv.log 2>&1; echo "pytest rc $?" >> /tmp/t/pytest-v$vv.log ) &
done
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck; do
  ( cd /tmp/src-var && WB_BWD_VARIANT=7 PYTHONPATH=/tmp/var timeout 170 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --backward-only > /tmp/t/$tool-v7.txt 2>&1 ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
for vv in 7; do echo "v$vv: $(tail -2 /tmp/t/pytest-v$vv.log | tr '\n' ' ')"; done
for f in memcheck racecheck; do echo "$f-v7: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases' /tmp/t/$f-v7.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
for run in a b; do
  PYTHONPATH=/tmp/var python3 benchmarks/ab_env.py --env WB_BWD_VARIANT --values 0,7,8 --backend wgmma --pass bwd --head-dims 64,128 --seqlens 1024,4096,16384 --rounds 15 --calls 4 > /tmp/t/abenv-$run.txt 2>&1
  echo "== run $run ($(( $(date +%s)-t0 )) s)"; grep -A20 "^# paired" /tmp/t/abenv-$run.txt
done
tar czf $OUT/c14.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
