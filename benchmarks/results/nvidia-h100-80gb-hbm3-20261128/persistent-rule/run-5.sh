#!/bin/bash
# The tree with the persistent rule at 4096 keys: the 4096-16384-key cells by the bench suite (env 0 vs 1, three rounds), the whole GPU suite, memcheck (forced persistent) and racecheck.
cd "${REPO:-.}"
mkdir -p /tmp/logs
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { grep -E "error" /tmp/logs/build.log | head -20; exit 1; }
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 20 python3 benchmarks/ab_time.py smoke --backend wgmma --dtypes bf16 --head-dims 64,128 --seqlens 1024 --causal 0 --repeats 3 || { echo SMOKE FAILED; exit 1; }
for r in 1 2 3; do for e in 0 1; do
  WAVEBOOST_WGMMA_PERSISTENT=$e timeout 40 python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --dtypes bfloat16 --head-dims 128 --causal 0 --seqlens 4096,8192,16384 --impls waveboost_wgmma > /tmp/b.txt 2>&1
  grep -E "^L=.*waveboost_wgmma +ok" /tmp/b.txt | sed "s/^/env$e /" >> $OUT/bench-8k.txt
done; done
cat $OUT/bench-8k.txt | awk '{print $1, $2, $9}'
echo "bench done: $(( $(date +%s) - start )) s"
(timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE -n 12 tests > $OUT/pytest.log 2>&1; echo "pytest exit $?" >> $OUT/pytest.log) &
(WAVEBOOST_WGMMA_PERSISTENT=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool memcheck python3 tests/sanitize/run_cases.py --forward-only > $OUT/san-memcheck.txt 2>&1; echo "memcheck rc $?" >> $OUT/san-memcheck.txt) &
(PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 250 compute-sanitizer --tool racecheck python3 tests/sanitize/run_cases.py --forward-only > $OUT/san-racecheck.txt 2>&1; echo "racecheck rc $?" >> $OUT/san-racecheck.txt) &
wait
grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -20; tail -2 $OUT/pytest.log
for t in memcheck racecheck; do grep -h "SUMMARY\|rc \|run_cases:" $OUT/san-$t.txt | tail -3; done
echo "end: $(( $(date +%s) - start )) s"
