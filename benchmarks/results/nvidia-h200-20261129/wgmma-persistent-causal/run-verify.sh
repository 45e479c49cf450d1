#!/usr/bin/env bash
# Verification of land-pc (new) on an H200: tests, sanitizers, timings against main (base) and the measurement tree (var), peers.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); mkdir -p /tmp/t
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/t/wheels.log 2>&1 || tail -3 /tmp/t/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh new base var || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-new
( PYTHONPATH=/tmp/new timeout 280 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests -k "not backward" > /tmp/t/pytest-fwd.log 2>&1; echo "pytest rc $?" >> /tmp/t/pytest-fwd.log ) &
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( PYTHONPATH=/tmp/new timeout 280 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/$tool.txt 2>&1; echo "rc $?" >> /tmp/t/$tool.txt ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
echo "pytest: $(tail -2 /tmp/t/pytest-fwd.log | tr '\n' ' ')"
for f in memcheck racecheck synccheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' /tmp/t/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
cd /tmp/src-var
PYTHONPATH=/tmp/var python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 128 --causal 1 --seqlens 2048,32768 --rounds 10 --calls 2 > /tmp/t/abenv-32k.txt 2>&1
grep -A6 "^# paired" /tmp/t/abenv-32k.txt
cd /tmp/src-new
for r in 1 2 3 4; do
  order="base new"; [ $((r % 2)) = 0 ] && order="new base"
  for tree in $order; do
    PYTHONPATH=/tmp/$tree python3 benchmarks/ab_time.py $tree --backend wgmma --pass fwd --dtypes bf16 --head-dims 64 --seqlens 256,512,1024,1536 --causal 0 >> /tmp/t/ab-d64.txt 2>&1
  done
done
python3 benchmarks/ab_table.py /tmp/t/ab-d64.txt | tail -8
echo "timed $(( $(date +%s)-t0 )) s"
PYTHONPATH=/tmp/new timeout 200 python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --dtypes bfloat16 --pass fwd --head-dims 128 --seqlens 2048,4096,8192,16384 --repeats 20 --budget-ms 100 --impls waveboost_auto,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/t/peers > /tmp/t/peers.log 2>&1
tail -14 /tmp/t/peers/*.md 2>/dev/null | grep "^|" | tail -9
tar czf $OUT/verify.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
