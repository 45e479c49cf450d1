#!/usr/bin/env bash
# GPU checks of one built tree, side by side on one GPU: a pytest set and compute-sanitizer's memcheck, synccheck
# and racecheck over the matching calls of tests/sanitize/run_cases.py. Run from the tree's source folder with
# PYTHONPATH set to its build (benchmarks/build_trees.sh); logs go to OUTDIR, and one summary line per check to
# stdout. SET (default forward):
#   forward  the wgmma / persistent / block-shape / plan / registry / FP8 tests (pytest -n 6), sanitizers over
#            run_cases.py --forward-only --wgmma-only;
#   serving  the decode / kv-cache / varlen / registry / torch-serving / merge tests (pytest -n 8), sanitizers over
#            run_cases.py --serving-only.
# Further arguments are more test files for the same pytest run.
#
#   bash benchmarks/gpu_checks.sh OUTDIR [forward|serving] [tests/test_gpu.py ...]
set -uo pipefail
out="${1:?an output folder}"
set_name="${2:-forward}"
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "$out"
case "$set_name" in
  forward)
    tests=(tests/test_wgmma_pipeline.py tests/test_registry.py tests/test_fp8_gpu.py tests/test_gpu.py
           -k 'wgmma or persistent or block or plan or registry or fp8 or kernel')
    workers=6 cases=(--forward-only --wgmma-only) ;;
  serving)
    tests=(tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py tests/test_registry.py
           tests/test_torch_serving.py tests/test_merge.py)
    workers=8 cases=(--serving-only) ;;
  *) echo "SET is forward or serving; got $set_name" >&2; exit 2 ;;
esac
( timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n $workers "${tests[@]}" "$@" \
    > "$out/pytest.log" 2>&1; echo "rc $?" >> "$out/pytest.log" ) &
for tool in memcheck synccheck racecheck; do
  ( PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 compute-sanitizer --tool $tool --print-limit 20 \
      python3 tests/sanitize/run_cases.py "${cases[@]}" > "$out/$tool.txt" 2>&1; echo "rc $?" >> "$out/$tool.txt" ) &
done
wait
echo "pytest: $(grep -E 'passed|failed|error' "$out/pytest.log" | tail -2 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" "$out/pytest.log" | head -5
for tool in memcheck synccheck racecheck; do
  echo "$tool: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' "$out/$tool.txt" | tr '\n' ' ')"
done
