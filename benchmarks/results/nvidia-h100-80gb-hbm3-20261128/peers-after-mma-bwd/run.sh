#!/bin/bash
# main on an H200: the forward beside the peers (FA2 grid, bf16 and fp16), FP8, forward + backward and the mma backward beside the peers.
cd "${REPO:-.}"
mkdir -p /tmp/logs
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
python3 -m pip install -q --no-deps ${WHEELS:?folder with the flash_attn3_jax and einops wheels}/*.whl > /tmp/logs/wheels.log 2>&1
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { grep -E "error" /tmp/logs/build.log | head -20; exit 1; }
echo "built: $(( $(date +%s) - start )) s"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 20 python3 benchmarks/ab_time.py smoke --backend wgmma --dtypes bf16 --head-dims 64,128 --seqlens 1024 --causal 1 --repeats 3 || { echo SMOKE FAILED; exit 1; }
for dt in bfloat16 float16; do
  timeout 130 python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --dtypes $dt \
    --seqlens 512,1024,2048,4096,8192,16384 --impls waveboost_wgmma,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/fwd-$dt > $OUT/fwd-$dt.txt 2>&1
  echo "fwd $dt rc $? at $(( $(date +%s) - start )) s"; cp /tmp/fwd-$dt/summary.md $OUT/fwd-$dt-summary.md
done
timeout 90 python3 benchmarks/fp8_bench.py --lengths 1024,4096,8192,16384 > $OUT/fp8.txt 2>&1; echo "fp8 rc $? at $(( $(date +%s) - start )) s"
timeout 150 python3 benchmarks/backward_bench.py --no-charts --plain --device cuda --pass bwd,fwdbwd --head-dims 64,128 --causal both \
  --seqlens 1024,4096,16384 --impls waveboost_auto,waveboost_mma,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/bwd > $OUT/bwd-bf16.txt 2>&1
echo "bwd rc $? at $(( $(date +%s) - start )) s"; cp /tmp/bwd/summary.md $OUT/bwd-bf16-summary.md
tail -30 $OUT/fp8.txt
echo "end: $(( $(date +%s) - start )) s"
