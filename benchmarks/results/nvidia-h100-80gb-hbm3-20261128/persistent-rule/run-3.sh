#!/bin/bash
# Persistent form at head dim 64 (64-row blocks, two per SM) and at head dim 128 past 1024 keys: env 0 vs 1.
cd "${REPO:-.}"
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { grep -E "error" /tmp/logs/build.log | head -20; tail -20 /tmp/logs/build.log; exit 1; }
export XLA_PYTHON_CLIENT_PREALLOCATE=false
WAVEBOOST_WGMMA_PERSISTENT=1 timeout 20 python3 benchmarks/ab_time.py smoke --backend wgmma --dtypes bf16 --head-dims 64 --seqlens 1024 --causal 0 --repeats 3 || { echo SMOKE FAILED; exit 1; }
for r in 1 2 3; do
  for e in 0 1; do
    WAVEBOOST_WGMMA_PERSISTENT=$e timeout 40 python3 benchmarks/ab_time.py env$e --backend wgmma --dtypes bf16,fp16 --head-dims 64 --seqlens 256,512,1024,1536 --causal 0 --repeats 20 >> $OUT/ab.txt 2>>$OUT/ab-err.txt
    WAVEBOOST_WGMMA_PERSISTENT=$e timeout 40 python3 benchmarks/ab_time.py env$e --backend wgmma --dtypes bf16 --head-dims 128 --seqlens 1024,1536,2048,3072,4096,8192 --causal 0 --repeats 20 >> $OUT/ab.txt 2>>$OUT/ab-err.txt
  done
done
python3 benchmarks/ab_table.py $OUT/ab.txt | tee $OUT/ab-table.txt
(timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_wgmma_pipeline.py > $OUT/pytest.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest.txt) &
for tool in memcheck racecheck; do
  (WAVEBOOST_WGMMA_PERSISTENT=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool $tool python3 tests/sanitize/run_cases.py --forward-only > $OUT/san-$tool.txt 2>&1; echo "$tool rc $?" >> $OUT/san-$tool.txt) &
done
wait
tail -3 $OUT/pytest.txt; for t in memcheck racecheck; do grep -h "SUMMARY\|rc " $OUT/san-$t.txt | tail -2; done
