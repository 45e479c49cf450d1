#!/usr/bin/env bash
# Tree dc (branch decode-cluster): which merge the sanitizer's split decode calls take, then memcheck / racecheck /
# synccheck over the serving calls, with the clusters on (default) and off.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh dc || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-dc; export PYTHONPATH=/tmp/dc
python3 - <<'PY'
import torch, waveboost
mk = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)
for name, (q, k) in {"dense 1x2048 32/8": (mk(1, 1, 32, 128), mk(1, 2048, 8, 128)),
                     "mixed lengths 4x320 32/8": (mk(4, 1, 32, 128), mk(4, 320, 8, 128))}.items():
    print(name, waveboost.plan(q, k, k, backend="decode"))
PY
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( timeout 250 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --serving-only > $T/$tool.txt 2>&1; echo "rc $?" >> $T/$tool.txt ) &
done
( WAVEBOOST_DECODE_CLUSTER=0 timeout 250 compute-sanitizer --tool memcheck --print-limit 20 python3 tests/sanitize/run_cases.py --serving-only > $T/memcheck-off.txt 2>&1; echo "rc $?" >> $T/memcheck-off.txt ) &
wait
for f in memcheck racecheck synccheck memcheck-off; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' $T/$f.txt | tr '\n' ' ')"; done
echo "total $(( $(date +%s)-t0 )) s"
