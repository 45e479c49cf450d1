#!/usr/bin/env bash
# Trees mn (main) and dmw (decode-merge-write): serving tests and the three sanitizers on dmw, then
# decode_probe mn / dmw in alternating processes (two rounds) and SDPA cuDNN.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh mn dmw || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-dmw; export PYTHONPATH=/tmp/dmw
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
cd /tmp/src-dmw/benchmarks
S=1x2048x32x8,1x2048x64x8,1x8192x32x8,1x32768x32x8,2x8192x32x8,8x4096x32x8,16x8192x32x8,32x8192x32x1
for r in 1 2; do
  for t in mn dmw; do
    PYTHONPATH=/tmp/$t timeout 40 python3 decode_probe.py --impls wb_blhd --tag $t-$r --shapes $S >> $T/probe.jsonl 2>>$T/probe-err.txt
  done
done
python3 - <<'PY'
import json, collections, statistics, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/probe.jsonl") if l.startswith("{")]
d = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    if "wb_blhd" in r:
        d[tuple(r["shape"])][r["tag"].split("-")[0]].append((r["wb_blhd"], r["wb_blhd_pct"]))
print("shape | mn us | dmw us (pct) | mn/dmw")
for s, v in d.items():
    m = {t: statistics.median(x[0] for x in v[t]) for t in v}
    print("%s | %.2f | %.2f (%s) | %.3f" % ("x".join(map(str, s)), m["mn"], m["dmw"], v["dmw"][-1][1], m["mn"] / m["dmw"]))
PY
echo "total $(( $(date +%s)-t0 )) s"
