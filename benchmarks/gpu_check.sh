#!/usr/bin/env bash
# Build for one GPU architecture, then run the GPU test suite and compute-sanitizer side by side,
# and optionally the forward and backward benchmarks against the peers; logs go to $OUT (or
# ./gpu-check-logs). About 5 minutes on an H100 with BENCH=1.
#
#   bash benchmarks/gpu_check.sh [extra pytest args...]
#
# Environment: CUDAARCHS (default 90); WORKERS (pytest-xdist workers, default 8; 0: no xdist);
# SANITIZER=0 skips compute-sanitizer; BENCH=1 adds the forward (FA2 grid, bf16) and backward
# (--pass bwd) benchmarks with every peer that is installed; TEST_TIMEOUT (seconds, default 600);
# WHEELS, a folder of wheels installed (no dependencies) before the build: the flash_attn3_jax and
# einops wheels make FlashAttention-3 a peer.
set -uo pipefail
out="${OUT:-gpu-check-logs}"
mkdir -p "$out"
arch="${CUDAARCHS:-90}"
workers="${WORKERS:-8}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1  # several processes share the GPU

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
start=$(date +%s)
if [ -n "${WHEELS:-}" ] && ! python3 -m pip install -q --no-deps "$WHEELS"/*.whl > "$out/wheels.log" 2>&1; then
  tail -5 "$out/wheels.log"
  echo "WHEELS INSTALL FAILED"
  exit 1
fi
if ! python3 -m pip install --no-build-isolation --no-deps -v . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" \
    >"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -40
  echo "BUILD FAILED"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
python3 -m waveboost info

xdist=()
[ "$workers" != 0 ] && xdist=(-n "$workers")
(
  timeout "${TEST_TIMEOUT:-600}" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE "${xdist[@]}" "$@" \
      > "$out/pytest.log" 2>&1
  echo "pytest exit $?" >> "$out/pytest.log"
) &
if [ "${SANITIZER:-1}" != 0 ]; then
  (
    LOG_DIR="$out/sanitizer" PYTHON=python3 bash tests/sanitize/run_sanitizer.sh "$out/sanitizer-SUMMARY.txt" \
        > /dev/null 2>&1
    echo "sanitizer exit $?" >> "$out/sanitizer-SUMMARY.txt"
  ) &
fi
wait
grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -40
tail -3 "$out/pytest.log"
[ -f "$out/sanitizer-SUMMARY.txt" ] && grep -E "SUMMARY|calls|result|exit" "$out/sanitizer-SUMMARY.txt"
echo "tests: $(( $(date +%s) - start )) s"

if [ "${BENCH:-0}" = 1 ]; then
  common=(--no-charts --plain --device cuda --preset fa2 --dtypes bfloat16)
  python3 -m waveboost.bench "${common[@]}" --seqlens 1024,4096,16384 \
      --impls 'waveboost_wgmma,waveboost_mma,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3' --out "$out/forward" \
      > "$out/forward.txt" 2>&1 || echo "forward bench exit $?"
  python3 -m waveboost.bench "${common[@]}" --pass bwd --seqlens 1024,4096 \
      --impls 'waveboost_wgmma,waveboost_mma,waveboost_auto,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3' \
      --out "$out/backward" > "$out/backward.txt" 2>&1 || echo "backward bench exit $?"
  tail -4 "$out/forward.txt" "$out/backward.txt"
  echo "end: $(( $(date +%s) - start )) s"
fi
