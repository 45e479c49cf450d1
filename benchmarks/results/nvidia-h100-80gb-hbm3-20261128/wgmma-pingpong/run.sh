#!/bin/bash
# H100: main vs wgmma-persistent vs wgmma-pingpong (forward A/B, two alternating rounds), then the
# pingpong tree's wgmma tests and compute-sanitizer. TARBALLS: a folder with the git archive of each tree.
cd "${REPO:-.}"; export TARBALLS=${TARBALLS:?git archive of each tree: main.tgz persist.tgz pingpong.tgz}
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
bash benchmarks/build_trees.sh main persist pingpong || exit 1
cd /tmp/src-pingpong
PYTHONPATH=/tmp/pingpong WAVEBOOST_WGMMA_PERSISTENT=1 timeout 20 python3 benchmarks/ab_time.py smoke --backend wgmma --dtypes bf16 --head-dims 64,128 --seqlens 1024 --causal both --repeats 3 || { echo "SMOKE FAILED"; exit 1; }
A="--backend wgmma --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,2048,4096,16384 --causal both --repeats 20"
for r in 1 2; do
  for n in main persist pingpong; do PYTHONPATH=/tmp/$n timeout 40 python3 benchmarks/ab_time.py $n $A >> $OUT/ab.txt 2>>$OUT/ab-err.txt; done
  PYTHONPATH=/tmp/pingpong WAVEBOOST_WGMMA_PERSISTENT=0 timeout 40 python3 benchmarks/ab_time.py pingpong-only $A >> $OUT/ab.txt 2>>$OUT/ab-err.txt
  for n in main pingpong; do PYTHONPATH=/tmp/$n timeout 30 python3 benchmarks/ab_time.py $n --backend wgmma --dtypes e4m3 --head-dims 128 --seqlens 1024,4096,16384 --causal both --repeats 20 >> $OUT/ab-e4m3.txt 2>>$OUT/ab-err.txt; done
done
python3 benchmarks/ab_table.py $OUT/ab-e4m3.txt | tee $OUT/ab-e4m3-table.txt
python3 benchmarks/ab_table.py $OUT/ab.txt | tee $OUT/ab-table.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
(PYTHONPATH=/tmp/pingpong timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_wgmma_pipeline.py tests/test_gpu.py tests/test_fp8_gpu.py tests/test_varlen.py > $OUT/pytest.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest.txt) &
for tool in memcheck racecheck synccheck; do
  (PYTHONPATH=/tmp/pingpong PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 220 compute-sanitizer --tool $tool python3 tests/sanitize/run_cases.py --forward-only > $OUT/san-$tool.txt 2>&1; echo "$tool rc $?" >> $OUT/san-$tool.txt) &
done
wait
tail -3 $OUT/pytest.txt; for t in memcheck racecheck synccheck; do grep -h "SUMMARY\|rc " $OUT/san-$t.txt | tail -2; done
