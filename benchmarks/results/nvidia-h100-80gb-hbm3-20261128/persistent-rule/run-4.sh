#!/bin/bash
# The persistent rule at head dim 64 and to 8192 keys: peers table, auto's mma-vs-wgmma cell, whole GPU suite + sanitizers.
cd "${REPO:-.}"
mkdir -p /tmp/logs
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps ${WHEELS:?folder with the flash_attn3_jax and einops wheels}/*.whl > /tmp/logs/wheels.log 2>&1
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { grep -E "error" /tmp/logs/build.log | head -20; exit 1; }
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 20 python3 benchmarks/ab_time.py smoke --backend wgmma --dtypes bf16 --head-dims 64,128 --seqlens 1024 --causal 0 --repeats 3 || { echo SMOKE FAILED; exit 1; }
for dt in bfloat16 float16; do
  timeout 120 python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --dtypes $dt \
    --seqlens 512,1024,2048,4096,8192,16384 --impls waveboost_wgmma,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/fwd-$dt > $OUT/fwd-$dt.txt 2>&1
  echo "fwd $dt rc $?"; cp /tmp/fwd-$dt/summary.md $OUT/fwd-$dt-summary.md
done
for r in 1 2; do for b in mma wgmma; do
  timeout 30 python3 benchmarks/ab_time.py $b --backend $b --dtypes bf16,fp16 --head-dims 64 --seqlens 256,512 --causal both --repeats 20 >> $OUT/ab-auto.txt 2>&1
done; done
python3 benchmarks/ab_table.py $OUT/ab-auto.txt > $OUT/ab-auto-table.txt
echo "bench done: $(( $(date +%s) - start )) s"
(timeout 330 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE -n 12 tests > $OUT/pytest.log 2>&1; echo "pytest exit $?" >> $OUT/pytest.log) &
(LOG_DIR=/tmp/san PYTHON=python3 timeout 330 bash tests/sanitize/run_sanitizer.sh $OUT/sanitizer-SUMMARY.txt > /dev/null 2>&1; echo "sanitizer exit $?" >> $OUT/sanitizer-SUMMARY.txt) &
wait
grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -20; tail -2 $OUT/pytest.log
grep -E "SUMMARY|exit|calls" $OUT/sanitizer-SUMMARY.txt
cat $OUT/ab-auto-table.txt | tail -12
echo "end: $(( $(date +%s) - start )) s"
