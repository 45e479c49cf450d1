#!/usr/bin/env bash
# Trees mn (main) and pd (combine-pdl): serving tests and the three sanitizers on pd, then
# decode_probe mn / pd in alternating processes (three rounds) over two sets, and SDPA cuDNN.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh mn pd || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-pd; export PYTHONPATH=/tmp/pd
( timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py tests/test_registry.py tests/test_torch_serving.py tests/test_merge.py > $T/pytest.log 2>&1; echo "rc $?" >> $T/pytest.log ) &
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( timeout 200 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --serving-only > $T/$tool.txt 2>&1; echo "rc $?" >> $T/$tool.txt ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
echo "pytest: $(grep -E 'passed|failed|error' $T/pytest.log | tail -3 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" $T/pytest.log | head -20
for f in memcheck racecheck synccheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' $T/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
cd /tmp/src-pd/benchmarks
S1=1x32768x32x1,2x32768x32x1,1x32768x64x1,8x16384x32x1,32x8192x32x1,1x32768x32x8,16x8192x32x8,1x2048x32x8
probe() {  # tag set extra-args...
  local tag=$1 set=$2; shift 2
  for r in 1 2 3; do for t in mn pd; do
    PYTHONPATH=/tmp/$t timeout 60 python3 decode_probe.py --impls wb_blhd --tag $t-$r-$tag --shapes $set "$@" >> $T/probe.jsonl 2>>$T/probe-err.txt
  done; done
}
probe d128 $S1
probe q4 1x32768x32x1,4x8192x32x1 --seqlen-q 4
timeout 60 python3 decode_probe.py --impls sdpa_cudnn --tag cudnn-d128 --shapes $S1 >> $T/probe.jsonl 2>>$T/probe-err.txt
python3 - <<'PY'
import json, collections, statistics, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/probe.jsonl") if l.startswith("{")]
d = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    t = r["tag"].split("-")
    if "wb_blhd" in r:
        d[(t[2], tuple(r["shape"]))][t[0]].append((r["wb_blhd"], r["wb_blhd_pct"], r.get("splits")))
    if "sdpa_cudnn" in r:
        d[(t[1], tuple(r["shape"]))]["cudnn"].append((r["sdpa_cudnn"], r["sdpa_cudnn_pct"], None))
print("set | shape | mn us (pct, splits) | pd us (pct, splits) | mn/pd | cudnn us (pct) | cudnn/pd")
for (s, sh), v in d.items():
    if "pd" not in v: continue
    m = {t: statistics.median(x[0] for x in v[t]) for t in v}
    c = "%.2f (%s) | %.3f" % (m["cudnn"], v["cudnn"][0][1], m["cudnn"] / m["pd"]) if "cudnn" in v else "- | -"
    print("%s | %s | %.2f (%s, %s) | %.2f (%s, %s) | %.3f | %s" % (s, "x".join(map(str, sh)), m["mn"], v["mn"][-1][1], v["mn"][-1][2], m["pd"], v["pd"][-1][1], v["pd"][-1][2], m["mn"] / m["pd"], c))
PY
tail -5 $T/probe-err.txt
echo "total $(( $(date +%s)-t0 )) s"
