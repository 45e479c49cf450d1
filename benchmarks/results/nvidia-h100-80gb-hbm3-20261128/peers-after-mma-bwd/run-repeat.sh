#!/bin/bash
# main on whatever Hopper comes: the forward beside the peers (FA2 grid, bf16) and FP8.
cd "${REPO:-.}"
mkdir -p /tmp/logs
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-deps ${WHEELS:?folder with the flash_attn3_jax and einops wheels}/*.whl > /tmp/logs/wheels.log 2>&1
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { grep -E "error" /tmp/logs/build.log | head -20; exit 1; }
echo "built: $(( $(date +%s) - start )) s"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 60 python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --dtypes bfloat16 \
  --seqlens 512,1024,2048,4096,8192,16384 --impls waveboost_wgmma,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/fwd > $OUT/fwd-bfloat16.txt 2>&1
echo "fwd rc $? at $(( $(date +%s) - start )) s"; cp /tmp/fwd/summary.md $OUT/fwd-bfloat16-summary.md
timeout 40 python3 benchmarks/fp8_bench.py --lengths 4096,8192,16384 --repeats 15 > $OUT/fp8.txt 2>&1; echo "fp8 rc $?"
grep "^| L=" $OUT/fwd-bfloat16-summary.md | awk -F'|' '{print $2, $(NF-1)}'
tail -14 $OUT/fp8.txt
echo "end: $(( $(date +%s) - start )) s"
