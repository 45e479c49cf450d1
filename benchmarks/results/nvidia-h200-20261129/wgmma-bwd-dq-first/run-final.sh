#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); mkdir -p /tmp/t
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/t/wheels.log 2>&1 || tail -3 /tmp/t/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh new || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
( cd /tmp/src-new && PYTHONPATH=/tmp/new timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py tests/test_backward.py > /tmp/t/pytest.log 2>&1; echo "pytest rc $?" >> /tmp/t/pytest.log )
echo "pytest: $(tail -2 /tmp/t/pytest.log | tr '\n' ' ')"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( cd /tmp/src-new && PYTHONPATH=/tmp/new timeout 170 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --backward-only > /tmp/t/$tool.txt 2>&1 ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
for f in memcheck racecheck synccheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases' /tmp/t/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
PYTHONPATH=/tmp/new timeout 200 python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --dtypes bfloat16 --pass bwd,fwdbwd --head-dims 128 --seqlens 4096,16384 --repeats 20 --budget-ms 100 --impls waveboost_auto,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/t/peers > /tmp/t/peers.txt 2>&1
echo "peers rc $? ($(( $(date +%s)-t0 )) s)"
grep -E "^\| L=" /tmp/t/peers/*.md 2>/dev/null | head -20 || tail -20 /tmp/t/peers.txt
tar czf $OUT/c11.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
