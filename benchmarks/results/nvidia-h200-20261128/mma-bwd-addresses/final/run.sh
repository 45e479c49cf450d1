#!/bin/bash
# mma-bwd-addresses (now with dV, dQ, dK order) against main: tests, A/B (2 rounds), then memcheck/racecheck.
cd "${REPO:-.}"
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
TARBALLS=${TARBALLS:?folder of the git archive tarballs} bash benchmarks/build_trees.sh main addr || exit 1
echo "built: $(( $(date +%s) - start )) s"
cd /tmp/src-addr
PYTHONPATH=/tmp/addr timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py tests/test_backward.py > $OUT/pytest-addr.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest-addr.txt
WAVEBOOST_MMA_BACKWARD_ROWS=64 PYTHONPATH=/tmp/addr timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py -k "mma" > $OUT/pytest-addr-rows64.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest-addr-rows64.txt
for f in pytest-addr pytest-addr-rows64; do tail -n 2 $OUT/$f.txt; done
echo "tests: $(( $(date +%s) - start )) s"
B="--pass bwd --backend mma --dtypes bf16 --head-dims 64,128 --seqlens 1024,4096 --causal both --repeats 10"
for r in 1 2; do
  PYTHONPATH=/tmp/main timeout 40 python3 benchmarks/ab_time.py main $B >> $OUT/ab-addr.txt 2>&1
  PYTHONPATH=/tmp/addr timeout 40 python3 benchmarks/ab_time.py addr $B >> $OUT/ab-addr.txt 2>&1
done
python3 benchmarks/ab_table.py $OUT/ab-addr.txt
echo "ab: $(( $(date +%s) - start )) s"
for tool in memcheck racecheck; do
  (PYTHONPATH=/tmp/addr PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool $tool python3 tests/sanitize/run_cases.py --backward-only > $OUT/san-$tool.txt 2>&1; echo "$tool rc $?" >> $OUT/san-$tool.txt) &
done
wait
for f in san-memcheck san-racecheck; do grep -E "ERROR SUMMARY|RACECHECK SUMMARY|calls OK|rc " $OUT/$f.txt | tail -3; done
echo "end: $(( $(date +%s) - start )) s"
