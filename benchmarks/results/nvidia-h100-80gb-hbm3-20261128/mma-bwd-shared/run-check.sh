#!/bin/bash
# The mma backward with P and dS through shared memory as the only 16-bit main kernel: beside the peers, whole GPU suite, sanitizers.
cd "${REPO:-.}"
mkdir -p /tmp/logs
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps ${WHEELS:?folder with the flash_attn3_jax and einops wheels}/*.whl > /tmp/logs/wheels.log 2>&1
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { grep -E "error" /tmp/logs/build.log | head -20; exit 1; }
echo "built: $(( $(date +%s) - start )) s"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 20 python3 benchmarks/ab_time.py smoke --pass bwd --backend mma --dtypes bf16 --head-dims 64,128 --seqlens 1024 --causal 1 --repeats 3 || { echo SMOKE FAILED; exit 1; }
timeout 200 python3 benchmarks/backward_bench.py --no-charts --plain --device cuda --pass bwd --head-dims 64,128 --causal both \
  --seqlens 1024,4096,16384 --impls waveboost_mma,waveboost_wgmma,sdpa_flash,sdpa_cudnn,fa3 --out /tmp/bwd > $OUT/bwd-bf16.txt 2>&1
echo "bwd rc $?"; cp /tmp/bwd/summary.md $OUT/bwd-bf16-summary.md
echo "bench done: $(( $(date +%s) - start )) s"
(timeout 330 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE -n 12 tests > $OUT/pytest.log 2>&1; echo "pytest exit $?" >> $OUT/pytest.log) &
(LOG_DIR=/tmp/san PYTHON=python3 timeout 330 bash tests/sanitize/run_sanitizer.sh $OUT/sanitizer-SUMMARY.txt > /dev/null 2>&1; echo "sanitizer exit $?" >> $OUT/sanitizer-SUMMARY.txt) &
wait
grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -20; tail -2 $OUT/pytest.log
grep -E "SUMMARY|exit|calls" $OUT/sanitizer-SUMMARY.txt
grep -E "waveboost_mma|sdpa_flash|sdpa_cudnn" $OUT/bwd-bf16.txt | grep -E " ok" | head -40
echo "end: $(( $(date +%s) - start )) s"
