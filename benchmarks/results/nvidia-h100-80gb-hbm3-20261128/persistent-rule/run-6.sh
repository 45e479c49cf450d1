#!/bin/bash
# The tree with the persistent rule at 8192 keys: build, the wgmma pipeline, GPU and stream tests.
cd "${REPO:-.}"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/build.log 2>&1 || { grep error /tmp/build.log | head; exit 1; }
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE -n 12 tests/test_wgmma_pipeline.py tests/test_gpu.py tests/test_streams.py > $OUT/pytest.log 2>&1; echo "pytest exit $?" >> $OUT/pytest.log
grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head; tail -2 $OUT/pytest.log
