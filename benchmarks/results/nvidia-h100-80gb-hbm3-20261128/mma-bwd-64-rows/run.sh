#!/bin/bash
# mma backward at head dim 64 in 64-row steps (the form for devices with less shared memory per block), forced by WAVEBOOST_MMA_BACKWARD_ROWS=64 on an H100: tests, timing beside the 128-row form, sanitizers.
cd "${REPO:-.}"
mkdir -p /tmp/logs
start=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { grep -E "error" /tmp/logs/build.log | head -20; exit 1; }
echo "built: $(( $(date +%s) - start )) s"
WAVEBOOST_MMA_BACKWARD_ROWS=64 timeout 20 python3 benchmarks/ab_time.py smoke --pass bwd --backend mma --dtypes bf16 --head-dims 64 --seqlens 1024 --causal 1 --repeats 3 || { echo SMOKE FAILED; exit 1; }
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py tests/test_registry.py > $OUT/pytest.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest.txt
grep -E "^(FAILED|ERROR)" $OUT/pytest.txt | head; tail -2 $OUT/pytest.txt
echo "tests: $(( $(date +%s) - start )) s"
B="--pass bwd --backend mma --dtypes bf16 --head-dims 64 --seqlens 1024,4096 --causal both --repeats 10"
for r in 1 2; do
  timeout 30 python3 benchmarks/ab_time.py rows128 $B >> $OUT/ab.txt 2>&1
  WAVEBOOST_MMA_BACKWARD_ROWS=64 timeout 30 python3 benchmarks/ab_time.py rows64 $B >> $OUT/ab.txt 2>&1
done
python3 benchmarks/ab_table.py $OUT/ab.txt > $OUT/ab-table.txt
(WAVEBOOST_MMA_BACKWARD_ROWS=64 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck python3 tests/sanitize/run_cases.py --backward-only > /tmp/m.txt 2>&1; echo "memcheck rc $?" >> /tmp/m.txt) &
(WAVEBOOST_MMA_BACKWARD_ROWS=64 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool racecheck python3 tests/sanitize/run_cases.py --backward-only > /tmp/r.txt 2>&1; echo "racecheck rc $?" >> /tmp/r.txt) &
wait
cat /tmp/m.txt /tmp/r.txt | grep -E "SUMMARY|rc |run_cases:" > $OUT/sanitizers.txt; cat $OUT/sanitizers.txt
cat $OUT/ab-table.txt
echo "end: $(( $(date +%s) - start )) s"
