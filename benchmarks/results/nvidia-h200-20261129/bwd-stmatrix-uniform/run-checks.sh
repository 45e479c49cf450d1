#!/usr/bin/env bash
# build main + new, tests of new's backward, sanitizers (backward only) on new
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/device.txt
t0=$(date +%s)
TARBALLS=${TARBALLS:?folder of main.tgz and new.tgz} bash benchmarks/build_trees.sh main new || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-new
export PYTHONPATH=/tmp/new
timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py tests/test_backward.py > $OUT/pytest.log 2>&1; echo "pytest rc $?" >> $OUT/pytest.log
tail -3 $OUT/pytest.log
echo "tests $(( $(date +%s)-t0 )) s"
WAVEBOOST_MMA_BACKWARD_ROWS=64 timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py -k mma > $OUT/pytest-rows64.log 2>&1; echo "rc $?" >> $OUT/pytest-rows64.log
tail -2 $OUT/pytest-rows64.log
echo "rows64 $(( $(date +%s)-t0 )) s"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
S=compute-sanitizer
( $S --tool memcheck --print-limit 20 python3 tests/sanitize/run_cases.py --backward-only > $OUT/memcheck.txt 2>&1 ) &
( $S --tool racecheck --print-limit 20 python3 tests/sanitize/run_cases.py --backward-only > $OUT/racecheck.txt 2>&1 ) &
( WAVEBOOST_MMA_BACKWARD_ROWS=64 $S --tool racecheck --print-limit 20 python3 tests/sanitize/run_cases.py --backward-only > $OUT/racecheck-rows64.txt 2>&1 ) &
( $S --tool synccheck --print-limit 20 python3 tests/sanitize/run_cases.py --backward-only > $OUT/synccheck.txt 2>&1 ) &
wait
for f in memcheck racecheck racecheck-rows64 synccheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases' $OUT/$f.txt | tr '\n' ' ')"; done
echo "total $(( $(date +%s)-t0 )) s"
