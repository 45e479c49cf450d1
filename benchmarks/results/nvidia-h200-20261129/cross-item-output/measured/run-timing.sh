#!/usr/bin/env bash
# timings: xi deferred (0) vs immediate (1); d128w grid beside peers
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); T=$OUT; ROOT=$PWD
if [ ! -d /tmp/xi/waveboost ] || [ ! -d /tmp/d128w/waveboost ]; then
  echo "cold machine: rebuilding"
  python3 -m pip install -q --no-deps .whl/*.whl > /tmp/wheels.log 2>&1
  TARBALLS=.devrun bash benchmarks/build_trees.sh d128w xi || exit 1
fi
python3 -c "import flash_attn3_jax" 2>/dev/null || python3 -m pip install -q --no-deps .whl/*.whl > /tmp/wheels.log 2>&1
cd /tmp/src-xi; export PYTHONPATH=/tmp/xi
timeout 230 python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 1,0 --backend wgmma --pass fwd --dtypes bf16 --head-dims 64,128 --causal both --seqlens 512,1024,2048,4096 --rounds 6 --calls 4 > $T/abenv16.txt 2>&1
grep -A20 "^# paired" $T/abenv16.txt
timeout 110 python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 1,0 --backend wgmma --pass fwd --dtypes e4m3 --head-dims 128 --causal both --seqlens 512,1024,2048,4096 --rounds 6 --calls 4 > $T/abenv8.txt 2>&1
grep -A12 "^# paired" $T/abenv8.txt
echo "ab $(( $(date +%s)-t0 )) s"
cd /tmp/src-d128w; export PYTHONPATH=/tmp/d128w
B="python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --repeats 20 --budget-ms 100"
timeout 150 $B --dtypes bfloat16,float16 --pass fwd --head-dims 128 --impls waveboost_wgmma,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out $T/fwd > $T/fwd.log 2>&1
grep "^|" $T/fwd/summary.md | sed -n '/^| cell/,$p' | cut -c1-160 | head -40
echo "total $(( $(date +%s)-t0 )) s"
