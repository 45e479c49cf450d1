#!/usr/bin/env bash
# Tree d128w (branch d128-wide, or main + d128-wide.patch): the GPU tests and sanitizers of the 192-key 16-bit tiles,
# then the forward grid at head dim 128 beside the peers.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); T=$OUT; ROOT=$PWD  # this checkout: its benchmarks/gpu_checks.sh
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/wheels.log 2>&1 || tail -3 /tmp/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh d128w || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-d128w; export PYTHONPATH=/tmp/d128w
bash $ROOT/benchmarks/gpu_checks.sh $T
echo "checked $(( $(date +%s)-t0 )) s"
B="python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --repeats 20 --budget-ms 100"
timeout 150 $B --dtypes bfloat16,float16 --pass fwd --head-dims 128 --impls waveboost_wgmma,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out $T/fwd > $T/fwd.log 2>&1
grep "^|" $T/fwd/summary.md | sed -n '/^| cell/,$p' | cut -c1-160 | head -40
echo "total $(( $(date +%s)-t0 )) s"
