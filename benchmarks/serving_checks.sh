#!/usr/bin/env bash
# The serving kernels' GPU checks on one built tree, side by side on one GPU: the decode / kv-cache / varlen /
# registry / torch-serving / merge tests (pytest -n 8) and compute-sanitizer's memcheck, racecheck and synccheck
# over tests/sanitize/run_cases.py --serving-only. Run from the tree's source folder with PYTHONPATH set to its
# build (benchmarks/build_trees.sh); logs go to OUTDIR, and one summary line per check to stdout. Extra
# arguments are more test files for the same pytest run.
#
#   bash benchmarks/serving_checks.sh OUTDIR [tests/test_gpu.py ...]
set -uo pipefail
out="${1:?an output folder}"
shift
mkdir -p "$out"
( timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_decode_gpu.py tests/test_kvcache.py \
    tests/test_varlen.py tests/test_registry.py tests/test_torch_serving.py tests/test_merge.py "$@" \
    > "$out/pytest.log" 2>&1; echo "rc $?" >> "$out/pytest.log" ) &
for tool in memcheck racecheck synccheck; do
  ( PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 compute-sanitizer --tool $tool --print-limit 20 \
      python3 tests/sanitize/run_cases.py --serving-only > "$out/$tool.txt" 2>&1; echo "rc $?" >> "$out/$tool.txt" ) &
done
wait
echo "pytest: $(grep -E 'passed|failed|error' "$out/pytest.log" | tail -2 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" "$out/pytest.log" | head -5
for tool in memcheck racecheck synccheck; do
  echo "$tool: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' "$out/$tool.txt" | tr '\n' ' ')"
done
