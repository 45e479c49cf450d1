#!/usr/bin/env bash
# Tree dc: synccheck on single split decode calls (clusters of 16 / 8 / 4 / 2, and off), then the probe at 1 x 2k with
# 16 pieces (clusters of 16), 8 pieces (WAVEBOOST_DECODE_MAX_SPLITS=8: clusters of 8) and the global merge.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh dc || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-dc; export PYTHONPATH=/tmp/dc
cat > /tmp/one.py <<'PY'
import sys, torch, waveboost
b, lk, h, hkv = (int(x) for x in sys.argv[1:5])
g = torch.Generator(device="cuda").manual_seed(1)
mk = lambda *s: torch.randn(*s, generator=g, device="cuda").to(torch.bfloat16)
q, k, v = mk(b, 1, h, 128), mk(b, lk, hkv, 128), mk(b, lk, hkv, 128)
print(waveboost.plan(q, k, v, backend="decode"))
for _ in range(2):
    o = waveboost.attention(q, k, v, backend="decode")
torch.cuda.synchronize(); print("ok", float(o.float().abs().sum()))
PY
run() { local tag=$1; shift; ( env "$@" compute-sanitizer --tool synccheck --print-limit 3 python3 /tmp/one.py $SHAPE > $T/sync-$tag.txt 2>&1; echo "rc $?" >> $T/sync-$tag.txt ); echo "$tag: $(grep -h "merge\|ERROR SUMMARY\|Missing\|^rc" $T/sync-$tag.txt | sed 's/.persistent.*//' | tr '\n' ' ' | cut -c1-300)"; }
SHAPE="1 2048 32 8" run c16 WAVEBOOST_DECODE_CLUSTER=1
SHAPE="1 2048 32 8" run off WAVEBOOST_DECODE_CLUSTER=0
SHAPE="1 2048 32 8" run c8 WAVEBOOST_DECODE_CLUSTER=1 WAVEBOOST_DECODE_MAX_SPLITS=8
SHAPE="1 2048 16 16" run c8b WAVEBOOST_DECODE_CLUSTER=1
SHAPE="4 320 32 8" run c4 WAVEBOOST_DECODE_CLUSTER=1
SHAPE="8 4096 32 8" run c2spread WAVEBOOST_DECODE_CLUSTER=1
SHAPE="1 2048 32 8" run c16-racecheck-free WAVEBOOST_DECODE_CLUSTER=2
echo "sync $(( $(date +%s)-t0 )) s"
cd benchmarks
for r in 1 2; do
  for c in "WAVEBOOST_DECODE_CLUSTER=0" "WAVEBOOST_DECODE_CLUSTER=1" "WAVEBOOST_DECODE_CLUSTER=1 WAVEBOOST_DECODE_MAX_SPLITS=8" "WAVEBOOST_DECODE_CLUSTER=0 WAVEBOOST_DECODE_MAX_SPLITS=8"; do
    env $c timeout 60 python3 decode_probe.py --impls wb_blhd --tag "$c" --shapes 1x2048x32x8,1x8192x32x8,1x2048x64x8 2>>$T/probe-err.txt | tee -a $T/probe.jsonl | cut -c1-150
  done
done
echo "total $(( $(date +%s)-t0 )) s"
