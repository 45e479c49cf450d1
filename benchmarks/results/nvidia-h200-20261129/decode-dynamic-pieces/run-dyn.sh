#!/usr/bin/env bash
# Tree: branch decode-dynamic (dynamic pieces, WAVEBOOST_DECODE_DYNAMIC=0 turns them off per call).
# git archive decode-dynamic | gzip > .devrun/dyn.tgz; carry [".devrun"].
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh dyn || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-dyn
export PYTHONPATH=/tmp/dyn
( timeout 280 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py tests/test_registry.py tests/test_torch_serving.py > /tmp/t/pytest.log 2>&1; echo "rc $?" >> /tmp/t/pytest.log ) &
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( timeout 280 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --serving-only > /tmp/t/$tool.txt 2>&1; echo "rc $?" >> /tmp/t/$tool.txt ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
echo "pytest: $(grep -E 'passed|failed|error' /tmp/t/pytest.log | tail -3 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" /tmp/t/pytest.log | head -20
for f in memcheck racecheck synccheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc\|Error' $f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
cd benchmarks
S=1x32768x32x8,1x16384x32x8,2x32768x32x8,1x131072x32x8,4x8192x32x8,8x16384x32x8,1x32768x64x8,1x8192x32x8,1x2048x32x8,16x8192x32x8
for r in 1 2; do
  WAVEBOOST_DECODE_DYNAMIC=0 python3 decode_probe.py --impls wb_blhd --tag off$r --shapes $S >> /tmp/t/probe.jsonl 2>/tmp/t/probe-err.txt
  python3 decode_probe.py --impls wb_blhd --tag on$r --shapes $S >> /tmp/t/probe.jsonl 2>>/tmp/t/probe-err.txt
  echo "probe round $r $(( $(date +%s)-t0 )) s"
done
python3 decode_probe.py --impls sdpa_cudnn --tag cudnn --shapes $S >> /tmp/t/probe.jsonl 2>>/tmp/t/probe-err.txt
P=1x32768x32x8,4x8192x32x8
for ps in 16 256; do for r in 1 2; do
  WAVEBOOST_DECODE_DYNAMIC=0 python3 decode_probe.py --impls wb_blhd --tag poff$r --page-size $ps --shapes $P >> /tmp/t/probe-paged$ps.jsonl 2>>/tmp/t/probe-err.txt
  python3 decode_probe.py --impls wb_blhd --tag pon$r --page-size $ps --shapes $P >> /tmp/t/probe-paged$ps.jsonl 2>>/tmp/t/probe-err.txt
done; done
echo "probes $(( $(date +%s)-t0 )) s"
python3 - <<'PY'
import json, collections, statistics
for f in ("/tmp/t/probe.jsonl", "/tmp/t/probe-paged16.jsonl", "/tmp/t/probe-paged256.jsonl"):
    rows = [json.loads(l) for l in open(f) if l.startswith("{")]
    d = collections.defaultdict(dict)
    for r in rows:
        for key in ("wb_blhd", "sdpa_cudnn"):
            if key in r: d[tuple(r["shape"])][r["tag"]] = (r[key], r[key + "_pct"])
    print(f)
    print("shape | off us (pct) | on us (pct) | off/on r1 r2 | cudnn us (pct) | cudnn/on")
    for s, v in d.items():
        off = [v[t][0] for t in v if t.startswith("off") or t.startswith("poff")]
        on = [v[t][0] for t in v if t.startswith("on") or t.startswith("pon")]
        offp = [v[t][1] for t in v if t.startswith("off") or t.startswith("poff")]
        onp = [v[t][1] for t in v if t.startswith("on") or t.startswith("pon")]
        ratios = " ".join(f"{a / b:.3f}" for a, b in zip(off, on))
        c = v.get("cudnn")
        cs = f"{c[0]:.1f} ({c[1]}) | {c[0] / statistics.median(on):.3f}" if c else "- | -"
        print(f"{'x'.join(map(str, s))} | {statistics.median(off):.1f} ({'/'.join(map(str, offp))}) | "
              f"{statistics.median(on):.1f} ({'/'.join(map(str, onp))}) | {ratios} | {cs}")
PY
tail -3 /tmp/t/probe-err.txt
tar czf $OUT/dyn.tgz -C /tmp/t .
