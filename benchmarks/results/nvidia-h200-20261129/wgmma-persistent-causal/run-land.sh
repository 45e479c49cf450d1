#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); mkdir -p /tmp/t
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/t/wheels.log 2>&1 || tail -3 /tmp/t/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh land || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-land
( PYTHONPATH=/tmp/land timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests -k "not backward" > /tmp/t/pytest-fwd.log 2>&1; echo "pytest rc $?" >> /tmp/t/pytest-fwd.log ) &
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( PYTHONPATH=/tmp/land timeout 300 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/$tool.txt 2>&1; echo "rc $?" >> /tmp/t/$tool.txt ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
echo "pytest: $(tail -2 /tmp/t/pytest-fwd.log | tr '\n' ' ')"
for f in memcheck racecheck synccheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' /tmp/t/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
PYTHONPATH=/tmp/land timeout 150 python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --dtypes bfloat16 --pass fwd --head-dims 128 --seqlens 2048,4096,8192,16384 --repeats 20 --budget-ms 100 --impls waveboost_wgmma,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/t/peers > /tmp/t/peers.log 2>&1
grep "^|" /tmp/t/peers/summary.md | tail -9
tar czf $OUT/land.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
