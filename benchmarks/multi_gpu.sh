#!/usr/bin/env bash
# Context parallelism on the GPUs of one host (2 or more): build for one architecture, the distributed
# tests (gloo on the CPU, NCCL on the GPUs, JAX), then the context-parallel benchmark
# (python -m waveboost.bench --distributed N, waveboost's ring against one GPU and PyTorch's context_parallel).
#
#   bash benchmarks/multi_gpu.sh [extra benchmark options]
#
# Steps, chosen with STEPS (default "build test bench long"):
#   build  pip install . for CUDAARCHS (default 90)
#   test   pytest tests/test_distributed.py (the NCCL test needs 2 GPUs)
#   bench  seqlens ${SEQLENS:-32768,65536,131072}: both layouts, ring and allgather, forward and
#          forward+backward, compute/communication split, torch_cp                       -> .../context-parallel/
#   long   seqlens ${LONG_SEQLENS:-262144}, zigzag only, no compute split             -> .../context-parallel/long/
# Each benchmark step stops after BENCH_TIMEOUT seconds (default 330); its CSV keeps every row measured by then.
# Under a 10-minute limit per command run it in two: STEPS="build test bench", then STEPS="long" (STEPS="build long"
# if the machine was given back in between).
# Other settings: NPROC (ranks; default every GPU), CUDAARCHS (default 90).
#
# Results and logs: benchmarks/results/<device>-<YYYYMMDD>/context-parallel/, copied to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
steps=" ${STEPS:-build test bench long} "
arch="${CUDAARCHS:-90}"
python=${PYTHON:-python3}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
nproc="${NPROC:-$gpus}"
if (( gpus < 2 || nproc < 2 )); then
  echo "context parallelism needs 2 GPUs or more; nvidia-smi lists ${gpus}, NPROC=${nproc}" >&2
  exit 2
fi
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr '[:upper:]' '[:lower:]' |
         sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//')
out="benchmarks/results/${device}-$(date -u +%Y%m%d)/context-parallel"
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
nvidia-smi topo -m >"$out/topology.txt" 2>&1 || true
status=0

if [[ "$steps" == *" build "* ]]; then
  start=$(date +%s)
  if ! $python -m pip install --no-build-isolation --no-deps -v . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" \
      >"$out/build.log" 2>&1; then
    grep -E "error|Error" "$out/build.log" | head -40
    echo "BUILD FAILED (log: $out/build.log)"
    exit 1
  fi
  echo "build: $(( $(date +%s) - start )) s"
  $python -m waveboost info | tee "$out/waveboost-info.txt"
fi

if [[ "$steps" == *" test "* ]]; then
  $python -m pytest -q -p no:cacheprovider -o addopts="" -rfEs tests/test_distributed.py 2>&1 |
    tee "$out/pytest.log" | tail -30
  (( PIPESTATUS[0] == 0 )) || status=1
fi

bench() {  # $1: output folder, then benchmark options
  local dir="$1"; shift
  mkdir -p "$dir"
  timeout --kill-after=30 "${BENCH_TIMEOUT:-330}" \
    $python -m waveboost.bench --distributed "$nproc" --device cuda --out "$dir" "$@" 2>&1 | tee "$dir/bench.log"
  local rc=${PIPESTATUS[0]}
  (( rc == 124 )) && echo "benchmark stopped after ${BENCH_TIMEOUT:-330} s; the rows measured are in $dir"
  (( rc == 0 )) || status=1
}

if [[ "$steps" == *" bench "* ]]; then
  bench "$out" --seqlens "${SEQLENS:-32768,65536,131072}" "$@"
fi
if [[ "$steps" == *" long "* ]]; then
  bench "$out/long" --seqlens "${LONG_SEQLENS:-262144}" --layouts zigzag --no-compute-split "$@"
fi

if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT/$(dirname "$out")" && cp -r "$out" "$OUT/$(dirname "$out")/"
fi
exit $status
