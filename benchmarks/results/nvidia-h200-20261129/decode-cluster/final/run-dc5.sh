#!/usr/bin/env bash
# Tree dc (branch decode-cluster, clusters of at most 8): serving tests, the three sanitizers over the serving calls,
# then decode_probe with WAVEBOOST_DECODE_CLUSTER 0 / 1 in alternating processes (two rounds).
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh dc || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-dc; export PYTHONPATH=/tmp/dc
( timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py tests/test_registry.py tests/test_torch_serving.py > $T/pytest.log 2>&1; echo "rc $?" >> $T/pytest.log ) &
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( timeout 170 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --serving-only > $T/$tool.txt 2>&1; echo "rc $?" >> $T/$tool.txt ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
echo "pytest: $(grep -E 'passed|failed|error' $T/pytest.log | tail -3 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" $T/pytest.log | head -20
for f in memcheck racecheck synccheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' $T/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
cd benchmarks
S=1x2048x32x8,1x2048x64x8,1x8192x32x8,1x32768x32x8,2x8192x32x8,8x4096x32x8,16x8192x32x8
for r in 1 2; do
  for c in 0 1; do
    WAVEBOOST_DECODE_CLUSTER=$c timeout 40 python3 decode_probe.py --impls wb_blhd --tag c$c-$r --shapes $S >> $T/probe.jsonl 2>>$T/probe-err.txt
  done
done
timeout 40 python3 decode_probe.py --impls sdpa_cudnn --tag cudnn --shapes $S >> $T/probe.jsonl 2>>$T/probe-err.txt
python3 - <<'PY'
import json, collections, statistics, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/probe.jsonl") if l.startswith("{")]
d = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    for key in ("wb_blhd", "sdpa_cudnn"):
        if key in r:
            d[tuple(r["shape"])]["cudnn" if key == "sdpa_cudnn" else r["tag"].split("-")[0]].append((r[key], r[key + "_pct"], r.get("splits")))
print("shape | c0 us | c1 us (pct, splits) | c0/c1 | cudnn us (pct) | cudnn/c1")
for s, v in d.items():
    m = {t: statistics.median(x[0] for x in v[t]) for t in v}
    print("%s | %.2f | %.2f (%s, %s) | %.3f | %.2f (%s) | %.3f" % ("x".join(map(str, s)), m["c0"], m["c1"], v["c1"][-1][1], v["c1"][-1][2], m["c0"] / m["c1"], m["cudnn"], v["cudnn"][-1][1], m["cudnn"] / m["c1"]))
PY
echo "total $(( $(date +%s)-t0 )) s"
