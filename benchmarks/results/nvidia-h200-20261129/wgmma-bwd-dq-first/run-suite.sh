#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); mkdir -p /tmp/t
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/t/wheels.log 2>&1 || tail -3 /tmp/t/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh new || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
( cd /tmp/src-new && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/new timeout 300 compute-sanitizer --tool initcheck --print-limit 20 python3 tests/sanitize/run_cases.py --backward-only > /tmp/t/initcheck.txt 2>&1 ) &
( cd /tmp/src-new && PYTHONPATH=/tmp/new timeout 420 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests > /tmp/t/pytest-all.log 2>&1; echo "pytest exit $?" >> /tmp/t/pytest-all.log )
wait
tail -3 /tmp/t/pytest-all.log; grep -E "^(FAILED|ERROR)" /tmp/t/pytest-all.log | head
echo "initcheck: $(grep -h 'ERROR SUMMARY\|^run_cases' /tmp/t/initcheck.txt | tr '\n' ' ')"
tar czf $OUT/c12.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
