#!/usr/bin/env bash
# The forward kernels' GPU checks on one built tree, side by side on one GPU: the wgmma / persistent / block-shape /
# plan / registry / FP8 tests (pytest -n 6) and compute-sanitizer's memcheck, synccheck and racecheck over
# tests/sanitize/run_cases.py --forward-only --wgmma-only. Run from the tree's source folder with PYTHONPATH set to
# its build (benchmarks/build_trees.sh); logs go to OUTDIR, and one summary line per check to stdout.
#
#   bash benchmarks/gpu_checks.sh OUTDIR
set -uo pipefail
out="${1:?an output folder}"
mkdir -p "$out"
K='wgmma or persistent or block or plan or registry or fp8 or kernel'
( timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_wgmma_pipeline.py tests/test_registry.py \
    tests/test_fp8_gpu.py tests/test_gpu.py -k "$K" > "$out/pytest.log" 2>&1; echo "rc $?" >> "$out/pytest.log" ) &
for tool in memcheck synccheck racecheck; do
  ( PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 compute-sanitizer --tool $tool --print-limit 20 \
      python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > "$out/$tool.txt" 2>&1; echo "rc $?" >> "$out/$tool.txt" ) &
done
wait
echo "pytest: $(grep -E 'passed|failed|error' "$out/pytest.log" | tail -2 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" "$out/pytest.log" | head -5
for tool in memcheck synccheck racecheck; do
  echo "$tool: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' "$out/$tool.txt" | tr '\n' ' ')"
done
