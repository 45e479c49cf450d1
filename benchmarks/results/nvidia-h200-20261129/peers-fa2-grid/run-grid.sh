#!/usr/bin/env bash
# The FA2 grid beside the peers on main's kernels (tree fin = 9c304e0): forward (head dims 64 and 128, bf16 and
# fp16), backward and forward+backward (bf16).
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); mkdir -p /tmp/t
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/t/wheels.log 2>&1 || tail -3 /tmp/t/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh fin || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-fin
B="python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --repeats 20 --budget-ms 100"
PYTHONPATH=/tmp/fin timeout 100 $B --dtypes bfloat16,float16 --pass fwd --head-dims 64,128 --impls waveboost_wgmma,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/t/fwd > /tmp/t/fwd.log 2>&1
echo "fwd $(( $(date +%s)-t0 )) s"; grep "^|" /tmp/t/fwd/summary.md | sed -n '/^| cell/,$p' | cut -c1-200
PYTHONPATH=/tmp/fin timeout 100 $B --dtypes bfloat16 --pass bwd,fwdbwd --head-dims 64,128 --impls waveboost_auto,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/t/train > /tmp/t/train.log 2>&1
echo "train $(( $(date +%s)-t0 )) s"; grep "^|" /tmp/t/train/summary.md | sed -n '/^| cell/,$p' | cut -c1-200
tar czf $OUT/grid.tgz -C /tmp/t .
