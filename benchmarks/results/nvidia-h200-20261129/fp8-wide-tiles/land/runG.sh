#!/usr/bin/env bash
# Tree f8w (branch fp8-wide): checks, then the FP8 forward beside the peers.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); T=$OUT
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/wheels.log 2>&1 || tail -3 /tmp/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh f8w || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-f8w; export PYTHONPATH=/tmp/f8w
K='wgmma or persistent or block or plan or registry or fp8 or kernel'
( timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_wgmma_pipeline.py tests/test_registry.py tests/test_fp8_gpu.py tests/test_gpu.py -k "$K" > $T/pytest.log 2>&1; echo "rc $?" >> $T/pytest.log ) &
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck synccheck racecheck; do
( timeout 240 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > $T/$tool.txt 2>&1; echo "rc $?" >> $T/$tool.txt ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
echo "pytest: $(grep -E 'passed|failed|error' $T/pytest.log | tail -2 | tr '\n' ' ')"; grep -E "^FAILED|^ERROR" $T/pytest.log | head -5
for f in memcheck synccheck racecheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' $T/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
timeout 200 python3 benchmarks/fp8_bench.py --csv $T/fp8.csv > $T/fp8.txt 2>&1; cat $T/fp8.txt
echo "total $(( $(date +%s)-t0 )) s"
