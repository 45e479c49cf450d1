#!/usr/bin/env bash
# Build for one GPU architecture, then run the GPU test suite; logs go to $OUT (or ./gpu-check-logs).
# Usage: bash benchmarks/gpu_check.sh [extra pytest args...]
set -uo pipefail
out="${OUT:-gpu-check-logs}"
mkdir -p "$out"
arch="${CUDAARCHS:-90}"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
start=$(date +%s)
if ! python3 -m pip install --no-build-isolation --no-deps -v . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" \
    >"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -40
  echo "BUILD FAILED"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
python3 -m waveboost info
PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE "$@" 2>&1 | tee "$out/pytest.log" | tail -60
