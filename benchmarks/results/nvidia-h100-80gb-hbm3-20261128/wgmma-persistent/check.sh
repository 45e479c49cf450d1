#!/bin/bash
# The persistent wgmma forward against the one-block-per-item form, one build, alternating runs; then
# tests/test_wgmma_pipeline.py and memcheck over its several-items test. Run from the repository root.
#   CELLS="--dtypes bf16 --head-dims 64,128 --seqlens 512,1024,4096,16384 --causal both"  (second run)
#   CELLS="--dtypes bf16,fp16 --head-dims 128 --seqlens 512,1024,1536,2048,4096 --causal 0"  (next run)
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { tail -30 /tmp/logs/build.log; exit 1; }
# a multi-item smoke first: if it hangs, stop here
WAVEBOOST_WGMMA_PERSISTENT=1 timeout 20 python3 benchmarks/ab_time.py smoke --backend wgmma --dtypes bf16 --head-dims 128 --seqlens 1024 --causal 0 --repeats 3 || { echo "SMOKE FAILED"; exit 1; }
for r in 1 2; do
  for forced in 0 1; do
    tag=$([ $forced = 1 ] && echo persistent || echo off)
    WAVEBOOST_WGMMA_PERSISTENT=$forced timeout 30 python3 benchmarks/ab_time.py $tag --backend wgmma $CELLS --repeats 20 >> $OUT/ab.txt 2>>$OUT/ab-err.txt
  done
done
python3 benchmarks/ab_table.py $OUT/ab.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
(timeout 100 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_wgmma_pipeline.py > $OUT/pytest.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest.txt) &
WAVEBOOST_WGMMA_PERSISTENT=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 90 compute-sanitizer --tool memcheck python3 -m pytest -q -p no:cacheprovider tests/test_wgmma_pipeline.py -k several_items > $OUT/san-memcheck.txt 2>&1; echo "memcheck rc $?" >> $OUT/san-memcheck.txt
wait
tail -3 $OUT/pytest.txt; grep -h "ERROR SUMMARY\|rc \|passed\|failed" $OUT/san-memcheck.txt | tail -3
