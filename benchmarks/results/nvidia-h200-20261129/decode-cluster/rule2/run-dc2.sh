#!/usr/bin/env bash
# Tree dc (branch decode-cluster): the decode GPU tests, then the decode preset beside the peers (CUDA graphs).
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); T=$OUT
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/wheels.log 2>&1 || tail -3 /tmp/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh dc || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-dc; export PYTHONPATH=/tmp/dc
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_decode_gpu.py tests/test_kvcache.py > $T/pytest.log 2>&1; echo "rc $?" >> $T/pytest.log
echo "pytest: $(grep -E 'passed|failed|error' $T/pytest.log | tail -3 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" $T/pytest.log | head -20
echo "checked $(( $(date +%s)-t0 )) s"
timeout 280 python3 -m waveboost.bench --no-charts --plain --device cuda --preset decode --cuda-graphs \
    --impls waveboost_auto,sdpa_cudnn,sdpa_flash,jax_cudnn,fa3_kvcache --budget-ms 100 --out $T/decode > $T/decode.txt 2>&1
grep "^|" $T/decode/summary.md | cut -c1-200 | tail -30
echo "total $(( $(date +%s)-t0 )) s"
