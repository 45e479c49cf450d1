#!/bin/bash
# paged by TMA on every sm_90: tests, sanitizers, paged preset beside the peers
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { tail -30 /tmp/logs/build.log; exit 1; }
python3 -m pip install -q --no-deps "$WHEELS"/*.whl  # the flash_attn3_jax and einops wheels > /tmp/logs/wheels.log 2>&1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
(timeout 300 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py tests/test_torch_serving.py > $OUT/pytest.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest.txt) &
for tool in memcheck racecheck synccheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 400 compute-sanitizer --tool $tool python3 tests/sanitize/run_cases.py --serving-only > $OUT/san-$tool.txt 2>&1; echo "$tool rc $?" >> $OUT/san-$tool.txt
done
wait
tail -2 $OUT/pytest.txt; for t in memcheck racecheck synccheck; do grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc " $OUT/san-$t.txt | tail -2; done
timeout 150 python3 -m waveboost.bench --no-charts --plain --device cuda --preset paged --cuda-graphs --impls waveboost_auto,sdpa_cudnn,sdpa_flash,jax_cudnn,fa3_kvcache --budget-ms 100 > $OUT/peers-paged.txt 2>&1; echo "peers rc $?"
