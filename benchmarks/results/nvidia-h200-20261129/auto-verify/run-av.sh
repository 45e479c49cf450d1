#!/usr/bin/env bash
# Tree av (auto-verify): GPU tests (serving set, forward checks, torch integration) and the serving sanitizers,
# then decode_probe with --backend decode / wgmma in alternating processes (two rounds) at 4, 8 and 16 queries.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh av || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-av; export PYTHONPATH=/tmp/av
( timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py tests/test_registry.py tests/test_torch_serving.py tests/test_merge.py tests/test_gpu.py tests/test_torch_integration.py > $T/pytest.log 2>&1; echo "rc $?" >> $T/pytest.log ) &
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( timeout 240 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --serving-only > $T/$tool.txt 2>&1; echo "rc $?" >> $T/$tool.txt ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
echo "pytest: $(grep -E 'passed|failed|error' $T/pytest.log | tail -3 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" $T/pytest.log | head -20
for f in memcheck racecheck synccheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' $T/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
cd /tmp/src-av/benchmarks
probe() {  # q set
  local q=$1 set=$2
  for r in 1 2; do for b in decode wgmma; do
    timeout 90 python3 decode_probe.py --impls wb_blhd --tag $b-$r-q$q --backend $b --seqlen-q $q --shapes $set >> $T/probe.jsonl 2>>$T/probe-err.txt
  done; done
  timeout 60 python3 decode_probe.py --impls wb_blhd --tag auto-1-q$q --seqlen-q $q --shapes $set >> $T/probe.jsonl 2>>$T/probe-err.txt
}
probe 4 1x32768x32x1,4x8192x32x1,16x8192x32x1,16x8192x64x8
probe 8 16x8192x32x1,16x8192x64x4,16x8192x32x4
probe 16 8x8192x32x1,16x8192x32x2,16x8192x32x8
python3 - <<'PY'
import json, collections, statistics, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/probe.jsonl") if l.startswith("{")]
d = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    t = r["tag"].split("-")
    d[(t[2], tuple(r["shape"]))][t[0]].append((r["wb_blhd"], r["wb_blhd_pct"], r.get("backend"), r.get("splits")))
print("q | shape | decode us (pct, pieces) | wgmma us (pct) | wgmma/decode | auto us (backend)")
for (q, sh), v in d.items():
    m = {t: statistics.median(x[0] for x in v[t]) for t in v}
    print("%s | %s | %.2f (%s, %s) | %.2f (%s) | %.3f | %.2f (%s)" % (q, "x".join(map(str, sh)), m["decode"], v["decode"][-1][1], v["decode"][-1][3], m["wgmma"], v["wgmma"][-1][1], m["wgmma"] / m["decode"], m["auto"], v["auto"][-1][2]))
PY
tail -5 $T/probe-err.txt
echo "total $(( $(date +%s)-t0 )) s"
