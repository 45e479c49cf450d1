#!/bin/bash
# persistent wgmma forward (last V buffer released): A/B off vs on, tests, memcheck/racecheck
cd "${REPO:-.}"
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { tail -30 /tmp/logs/build.log; exit 1; }
# a multi-item smoke first: if it hangs, stop here
WAVEBOOST_WGMMA_PERSISTENT=1 timeout 20 python3 benchmarks/ab_time.py smoke --backend wgmma --dtypes bf16 --head-dims 128 --seqlens 1024 --causal 0 --repeats 3 || { echo "SMOKE FAILED"; exit 1; }
A="--backend wgmma --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,4096,16384 --causal both --repeats 20"
for r in 1 2; do
  WAVEBOOST_WGMMA_PERSISTENT=0 timeout 30 python3 benchmarks/ab_time.py off $A >> $OUT/ab.txt 2>>$OUT/ab-err.txt
  WAVEBOOST_WGMMA_PERSISTENT=1 timeout 30 python3 benchmarks/ab_time.py persistent $A >> $OUT/ab.txt 2>>$OUT/ab-err.txt
done
python3 - $OUT/ab.txt <<'PY'
import sys, collections, statistics
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    p = l.split()
    if len(p) < 8: continue
    d[(tuple(p[1:-1]), p[0])].append(float(p[-1]))
print("cell | off ms | persistent ms | off/persistent (>1: persistent faster)")
for c in dict.fromkeys(k[0] for k in d):
    o = statistics.median(d[(c, "off")]); q = statistics.median(d.get((c, "persistent"), [float("nan")]))
    print(" ".join(c), f"| {o:.4f} | {q:.4f} | {o/q:.3f}")
PY
export XLA_PYTHON_CLIENT_PREALLOCATE=false
(timeout 100 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_wgmma_pipeline.py > $OUT/pytest.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest.txt) &
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 90 compute-sanitizer --tool memcheck python3 -m pytest -q -p no:cacheprovider tests/test_wgmma_pipeline.py -k several_items > $OUT/san-memcheck.txt 2>&1; echo "memcheck rc $?" >> $OUT/san-memcheck.txt
wait
tail -3 $OUT/pytest.txt; grep -h "ERROR SUMMARY\|rc \|passed\|failed" $OUT/san-memcheck.txt | tail -3
