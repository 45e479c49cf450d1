#!/bin/bash
# Two branches in one H100 call: wgmma-persistent-causal (causal persistent, dynamic order; forced by
# WAVEBOOST_WGMMA_PERSISTENT=1) and mma-bwd-shared (WAVEBOOST_MMA_BACKWARD=shared), main as control.
# Needs .devrun/{main,causal,mmash}.tgz (git archive of main and of each branch; regenerate if they move).
cd "${REPO:-.}"
mkdir -p /tmp/logs
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
TARBALLS=.devrun bash benchmarks/build_trees.sh main causal mmash || exit 1
echo "built: $(( $(date +%s) - start )) s"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
cd /tmp/src-causal
PYTHONPATH=/tmp/causal WAVEBOOST_WGMMA_PERSISTENT=1 timeout 20 python3 benchmarks/ab_time.py smoke --backend wgmma --dtypes bf16 --head-dims 64,128 --seqlens 1024 --causal 1 --repeats 3 || echo "SMOKE causal FAILED"
PYTHONPATH=/tmp/mmash WAVEBOOST_MMA_BACKWARD=shared timeout 20 python3 benchmarks/ab_time.py smoke --pass bwd --backend mma --dtypes bf16 --head-dims 128 --seqlens 1024 --causal 0 --repeats 3 || echo "SMOKE mma shared FAILED"
A="--backend wgmma --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,2048,4096,8192 --causal 1 --repeats 20"
B="--pass bwd --backend mma --dtypes bf16 --head-dims 64,128 --seqlens 1024,4096,8192 --causal both --repeats 10"
for r in 1 2; do
  PYTHONPATH=/tmp/main timeout 40 python3 benchmarks/ab_time.py main $A >> $OUT/ab-causal.txt 2>>$OUT/ab-err.txt
  PYTHONPATH=/tmp/causal WAVEBOOST_WGMMA_PERSISTENT=1 timeout 40 python3 benchmarks/ab_time.py dynamic $A >> $OUT/ab-causal.txt 2>>$OUT/ab-err.txt
  PYTHONPATH=/tmp/main timeout 60 python3 benchmarks/ab_time.py registers $B >> $OUT/ab-bwd.txt 2>>$OUT/ab-err.txt
  PYTHONPATH=/tmp/mmash WAVEBOOST_MMA_BACKWARD=shared timeout 60 python3 benchmarks/ab_time.py shared $B >> $OUT/ab-bwd.txt 2>>$OUT/ab-err.txt
done
python3 benchmarks/ab_table.py $OUT/ab-causal.txt | tee $OUT/ab-causal-table.txt | tail -4
python3 benchmarks/ab_table.py $OUT/ab-bwd.txt | tee $OUT/ab-bwd-table.txt
echo "timed: $(( $(date +%s) - start )) s"
(PYTHONPATH=/tmp/causal timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_wgmma_pipeline.py tests/test_gpu.py tests/test_varlen.py tests/test_streams.py tests/test_registry.py > $OUT/pytest-causal.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest-causal.txt) &
(cd /tmp/src-mmash && PYTHONPATH=/tmp/mmash timeout 240 python3 -m pytest -q -n 6 -p no:cacheprovider tests/test_backward_gpu.py > $OUT/pytest-mmash.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest-mmash.txt) &
for tool in memcheck racecheck; do
  (PYTHONPATH=/tmp/causal WAVEBOOST_WGMMA_PERSISTENT=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 220 compute-sanitizer --tool $tool python3 tests/sanitize/run_cases.py --forward-only > $OUT/san-causal-$tool.txt 2>&1; echo "$tool rc $?" >> $OUT/san-causal-$tool.txt) &
  (cd /tmp/src-mmash && PYTHONPATH=/tmp/mmash WAVEBOOST_MMA_BACKWARD=shared PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 220 compute-sanitizer --tool $tool python3 tests/sanitize/run_cases.py --backward-only > $OUT/san-mmash-$tool.txt 2>&1; echo "$tool rc $?" >> $OUT/san-mmash-$tool.txt) &
done
wait
for f in pytest-causal pytest-mmash; do grep -E "^(FAILED|ERROR)" $OUT/$f.txt | head -5; tail -2 $OUT/$f.txt; done
for f in $OUT/san-*.txt; do echo "$f: $(grep -h "SUMMARY" $f | tail -1) $(grep -h "rc " $f | tail -1)"; done
echo "end: $(( $(date +%s) - start )) s"
