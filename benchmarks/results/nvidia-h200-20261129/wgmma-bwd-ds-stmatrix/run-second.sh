#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s)
python3 -m pip install -q --no-deps .whl/*.whl > $OUT/wheels.log 2>&1 || tail -3 $OUT/wheels.log
TARBALLS=${TARBALLS:?folder of main.tgz and new.tgz} bash benchmarks/build_trees.sh main new || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
( cd /tmp/src-new && PYTHONPATH=/tmp/new timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py tests/test_backward.py > $OUT/pytest.log 2>&1; echo "pytest rc $?" >> $OUT/pytest.log )
tail -2 $OUT/pytest.log
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for run in memcheck:tma racecheck:tma synccheck:tma memcheck:cp.async racecheck:cp.async; do
  tool=${run%%:*}; pl=${run#*:}
  ( cd /tmp/src-new && WAVEBOOST_WGMMA_BACKWARD=$pl PYTHONPATH=/tmp/new timeout 240 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --backward-only > $OUT/$tool-$pl.txt 2>&1 ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
for f in memcheck-tma racecheck-tma synccheck-tma memcheck-cp.async racecheck-cp.async; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases' $OUT/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
ab() {
  local name=$1 rounds=$2; shift 2
  for tree in main new; do PYTHONPATH=/tmp/$tree python3 benchmarks/ab_time.py $tree "$@" >/dev/null || echo "warm $tree failed"; done
  for r in $(seq $rounds); do
    order="main new"; [ $((r % 2)) = 0 ] && order="new main"
    for tree in $order; do PYTHONPATH=/tmp/$tree python3 benchmarks/ab_time.py $tree "$@" >> $OUT/ab-$name.txt; done
  done
  echo "== $name ($(( $(date +%s)-t0 )) s)"; python3 benchmarks/ab_table.py $OUT/ab-$name.txt | tail -1
}
ab wgmma 3 --backend wgmma --pass bwd --head-dims 64,128 --seqlens 1024,4096,16384
ab wgmma-det 3 --backend wgmma --pass bwd --head-dims 64,128 --seqlens 1024,4096,16384 --deterministic
PYTHONPATH=/tmp/new timeout 150 python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --dtypes bfloat16 --pass bwd,fwdbwd --head-dims 128 --seqlens 4096,16384 --repeats 20 --budget-ms 100 --impls waveboost_auto,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out $OUT/peers > $OUT/peers.txt 2>&1
echo "peers rc $? ($(( $(date +%s)-t0 )) s)"
grep -E "^\| L=" $OUT/peers/*.md 2>/dev/null | head -20 || tail -20 $OUT/peers.txt
