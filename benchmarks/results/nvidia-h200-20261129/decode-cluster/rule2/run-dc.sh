#!/usr/bin/env bash
# Tree dc (branch decode-cluster): serving tests and sanitizers, then decode_probe with WAVEBOOST_DECODE_CLUSTER 0 / 1 / 2
# in alternating processes (two rounds) and SDPA cuDNN.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh dc || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-dc; export PYTHONPATH=/tmp/dc
python3 -c "
import torch, waveboost
q = torch.randn(1, 1, 32, 128, device='cuda', dtype=torch.bfloat16); k = torch.randn(1, 2048, 8, 128, device='cuda', dtype=torch.bfloat16)
import os
for s in ('0', '1', '2'):
    os.environ['WAVEBOOST_DECODE_CLUSTER'] = s; print(s, waveboost.plan(q, k, k, backend='decode'))
" 2>&1 | tail -4
( timeout 280 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py tests/test_registry.py tests/test_torch_serving.py > $T/pytest.log 2>&1; echo "rc $?" >> $T/pytest.log ) &
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( timeout 280 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --serving-only > $T/$tool.txt 2>&1; echo "rc $?" >> $T/$tool.txt ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
echo "pytest: $(grep -E 'passed|failed|error' $T/pytest.log | tail -3 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" $T/pytest.log | head -20
for f in memcheck racecheck synccheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' $T/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
cd benchmarks
S=1x2048x32x8,1x8192x32x8,1x32768x32x8,2x8192x32x8,4x8192x32x8,8x4096x32x8,1x16384x64x8,1x2048x64x8,16x8192x32x8
for r in 1 2 3; do
  for c in 0 1 2; do
    WAVEBOOST_DECODE_CLUSTER=$c timeout 60 python3 decode_probe.py --impls wb_blhd --tag c$c-$r --shapes $S >> $T/probe.jsonl 2>>$T/probe-err.txt
  done
  echo "probe round $r $(( $(date +%s)-t0 )) s"
done
timeout 60 python3 decode_probe.py --impls sdpa_cudnn --tag cudnn --shapes $S >> $T/probe.jsonl 2>>$T/probe-err.txt
P=1x32768x32x8,4x8192x32x8
for c in 0 1 0 1; do
  WAVEBOOST_DECODE_CLUSTER=$c timeout 60 python3 decode_probe.py --impls wb_blhd --tag p$c --page-size 16 --shapes $P >> $T/probe-paged.jsonl 2>>$T/probe-err.txt
done
echo "probes $(( $(date +%s)-t0 )) s"
python3 - <<'PY'
import json, collections, statistics, os
T = os.environ["OUT"]
for f in (T + "/probe.jsonl", T + "/probe-paged.jsonl"):
    if not os.path.exists(f): continue
    rows = [json.loads(l) for l in open(f) if l.startswith("{")]
    d = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        for key in ("wb_blhd", "sdpa_cudnn"):
            if key in r:
                tag = "cudnn" if key == "sdpa_cudnn" else r["tag"].split("-")[0]
                d[tuple(r["shape"])][tag].append((r[key], r[key + "_pct"]))
    print(f.split("/")[-1])
    print("shape | c0 us | c1 us (pct) | c0/c1 | c2 us | c0/c2 | cudnn us (pct) | cudnn/c1")
    for s, v in d.items():
        med = {t: statistics.median(x[0] for x in v[t]) for t in v}
        pct = {t: v[t][-1][1] for t in v}
        c0 = med.get("c0", med.get("p0")); c1 = med.get("c1", med.get("p1")); c2 = med.get("c2")
        cu = med.get("cudnn")
        c2s = "-" if c2 is None else "%.2f | %.3f" % (c2, c0 / c2)
        cus = "- | -" if cu is None else "%.2f (%s) | %.3f" % (cu, pct.get("cudnn"), cu / c1)
        print("%s | %.2f | %.2f (%s) | %.3f | %s | %s" % ("x".join(map(str, s)), c0, c1, pct.get("c1", pct.get("p1")), c0 / c1, c2s, cus))
PY
tail -3 $T/probe-err.txt
echo "total $(( $(date +%s)-t0 )) s"
