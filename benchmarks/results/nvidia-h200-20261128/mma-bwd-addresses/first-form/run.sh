#!/bin/bash
# branch mma-bwd-addresses against main: backward GPU tests (both head dim 64 forms), memcheck/racecheck of the
# backward cases, A/B of the mma backward (3 rounds), the mma backward beside SDPA flash.
cd "${REPO:-.}"
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps ${WHEELS:?folder with the flash_attn3_jax and einops wheels}/*.whl > /dev/null 2>&1
TARBALLS=${TARBALLS:?folder of the git archive tarballs} bash benchmarks/build_trees.sh main addr || exit 1
echo "built: $(( $(date +%s) - start )) s"
cd /tmp/src-addr
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PYTHONPATH=/tmp/addr timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py tests/test_backward.py > $OUT/pytest-addr.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest-addr.txt
WAVEBOOST_MMA_BACKWARD_ROWS=64 PYTHONPATH=/tmp/addr timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py -k "mma" > $OUT/pytest-addr-rows64.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest-addr-rows64.txt
tail -2 $OUT/pytest-addr.txt $OUT/pytest-addr-rows64.txt
echo "tests: $(( $(date +%s) - start )) s"
for tool in memcheck racecheck; do
  (PYTHONPATH=/tmp/addr PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool $tool python3 tests/sanitize/run_cases.py --backward-only > $OUT/san-$tool.txt 2>&1; echo "$tool rc $?" >> $OUT/san-$tool.txt) &
done
wait
(WAVEBOOST_MMA_BACKWARD_ROWS=64 PYTHONPATH=/tmp/addr PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool racecheck python3 tests/sanitize/run_cases.py --backward-only > $OUT/san-racecheck-rows64.txt 2>&1; echo "racecheck rc $?" >> $OUT/san-racecheck-rows64.txt)
for f in san-memcheck san-racecheck san-racecheck-rows64; do grep -E "ERROR SUMMARY|RACECHECK SUMMARY|calls OK|rc " $OUT/$f.txt | tail -3; done
echo "sanitizer: $(( $(date +%s) - start )) s"
B="--pass bwd --backend mma --dtypes bf16 --head-dims 64,128 --seqlens 1024,4096 --causal both --repeats 10"
for r in 1 2 3; do
  PYTHONPATH=/tmp/main timeout 40 python3 benchmarks/ab_time.py main $B >> $OUT/ab-addr.txt 2>&1
  PYTHONPATH=/tmp/addr timeout 40 python3 benchmarks/ab_time.py addr $B >> $OUT/ab-addr.txt 2>&1
done
python3 benchmarks/ab_table.py $OUT/ab-addr.txt
echo "ab: $(( $(date +%s) - start )) s"
PYTHONPATH=/tmp/addr timeout 120 python3 benchmarks/backward_bench.py --no-charts --plain --device cuda --pass bwd --head-dims 64,128 --causal both \
  --seqlens 1024,4096,16384 --impls waveboost_mma,sdpa_flash --out /tmp/bwd > $OUT/bwd-mma-flash.txt 2>&1
cp /tmp/bwd/summary.md $OUT/bwd-mma-flash-summary.md 2>/dev/null
tail -30 $OUT/bwd-mma-flash.txt
echo "end: $(( $(date +%s) - start )) s"
