#!/bin/bash
# main after the mma backward's address and order change: the mma backward beside SDPA flash; racecheck with the 64-row form forced.
cd "${REPO:-.}"
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
echo "built: $(( $(date +%s) - start )) s"
timeout 90 python3 benchmarks/backward_bench.py --no-charts --plain --device cuda --pass bwd --head-dims 64,128 --causal both \
  --seqlens 1024,4096,16384 --impls waveboost_mma,sdpa_flash --out /tmp/bwd > $OUT/bwd-mma-flash.txt 2>&1
cp /tmp/bwd/summary.md $OUT/bwd-mma-flash-summary.md 2>/dev/null
grep -E "waveboost_mma" $OUT/bwd-mma-flash.txt | tail -12
echo "bench: $(( $(date +%s) - start )) s"
WAVEBOOST_MMA_BACKWARD_ROWS=64 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool racecheck python3 tests/sanitize/run_cases.py --backward-only > $OUT/san-racecheck-rows64.txt 2>&1; echo "racecheck rc $?" >> $OUT/san-racecheck-rows64.txt
grep -E "RACECHECK SUMMARY|calls OK|rc " $OUT/san-racecheck-rows64.txt | tail -3
echo "end: $(( $(date +%s) - start )) s"
