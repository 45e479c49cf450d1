#!/bin/bash
# persistent wgmma forward: A/B (main, new with env 0, new with env 1), then tests and sanitizers
cd "${REPO:-.}"
mkdir -p /tmp/logs /tmp/src-main && tar xzf "$TARBALLS"/main.tgz -C /tmp/src-main
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/main -Cbuild-dir=/tmp/build-main /tmp/src-main -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build-main.log 2>&1 &
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { tail -30 /tmp/logs/build.log; exit 1; }
wait
ls /tmp/main/waveboost >/dev/null || { tail -20 /tmp/logs/build-main.log; exit 1; }
A="--backend wgmma --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,2048,4096,16384 --causal both --repeats 30"
for r in 1 2; do
  (cd /tmp && PYTHONPATH=/tmp/main timeout 90 python3 $OLDPWD/benchmarks/ab_time.py main $A) >> $OUT/ab.txt 2>>/tmp/logs/ab-err.txt
  WAVEBOOST_WGMMA_PERSISTENT=0 timeout 90 python3 benchmarks/ab_time.py off $A >> $OUT/ab.txt 2>>/tmp/logs/ab-err.txt
  WAVEBOOST_WGMMA_PERSISTENT=1 timeout 90 python3 benchmarks/ab_time.py persistent $A >> $OUT/ab.txt 2>>/tmp/logs/ab-err.txt
done
python3 benchmarks/ab_table.py $OUT/ab.txt
tail -3 /tmp/logs/ab-err.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
(timeout 330 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_wgmma_pipeline.py tests/test_gpu.py tests/test_fp8_gpu.py > $OUT/pytest.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest.txt) &
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool $tool python3 tests/sanitize/run_cases.py --forward-only > $OUT/san-$tool.txt 2>&1; echo "$tool rc $?" >> $OUT/san-$tool.txt
done
wait
tail -3 $OUT/pytest.txt; grep -h "FAILED\|Error" $OUT/pytest.txt | head -10; for t in memcheck racecheck; do grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc " $OUT/san-$t.txt | tail -2; done
