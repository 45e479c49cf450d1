#!/usr/bin/env bash
# Runs compute-sanitizer's memcheck, racecheck, initcheck and synccheck over tests/sanitize/run_cases.py
# and writes a summary with each tool's "ERROR SUMMARY" line (commit it: zero errors is the guarantee).
#
#   tests/sanitize/run_sanitizer.sh [SUMMARY_FILE]      (default tests/sanitize/SUMMARY.txt)
#
# Needs a CUDA build of waveboost installed (CUDAARCHS=90 pip install --no-build-isolation .), PyTorch
# with CUDA, and compute-sanitizer (on PATH, or $COMPUTE_SANITIZER, or /usr/local/cuda/bin). Full logs go
# to $LOG_DIR (default tests/sanitize/logs, not meant to be committed). $SANITIZER_EXTRA adds options
# to every tool. PyTorch's caching allocator is turned off so that every tensor is its own allocation
# and memcheck sees an access past a tensor's end. Exit status: 0 only if every tool reports 0 errors
# and run_cases.py completed under each.
set -uo pipefail
cd "$(dirname "$0")/../.."

SANITIZER=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
SUMMARY=${1:-tests/sanitize/SUMMARY.txt}
LOG_DIR=${LOG_DIR:-tests/sanitize/logs}
PYTHON=${PYTHON:-python}
mkdir -p "$LOG_DIR" "$(dirname "$SUMMARY")"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1

if [ ! -x "$SANITIZER" ]; then
  echo "compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2
  exit 2
fi

{
  echo "# compute-sanitizer over tests/sanitize/run_cases.py"
  echo "date:       $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit:     ${SOURCE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')}"
  echo "device:     $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "sanitizer:  $("$SANITIZER" --version 2>/dev/null | grep -i version | head -1)"
  echo "cases:      $("$PYTHON" tests/sanitize/run_cases.py --list | wc -l) calls (every path x dtype, head_dim 64/128, causal/not, tails, GQA/MQA, empty rows, seqlen_k 0, BHSD views, unaligned views)"
  echo "command:    tests/sanitize/run_sanitizer.sh $*"
  echo
} > "$SUMMARY"

# The tools run side by side (each is its own process on the GPU); memcheck and racecheck run once
# more with the wgmma path (forward and backward) on its cp.async kernels (the default is the TMA
# pipeline).
status=0
runs="memcheck racecheck initcheck synccheck memcheck:cp.async racecheck:cp.async"
for run in $runs; do
  tool=${run%%:*}
  pipeline=${run#*:}; [ "$pipeline" = "$run" ] && pipeline=tma
  (
    start=$(date +%s)
    # shellcheck disable=SC2086
    WAVEBOOST_WGMMA_PIPELINE=$pipeline WAVEBOOST_WGMMA_BACKWARD=$pipeline "$SANITIZER" --tool "$tool" --print-limit 50 \
        --log-file "$LOG_DIR/$tool-$pipeline.log" ${SANITIZER_EXTRA:-} \
        "$PYTHON" tests/sanitize/run_cases.py > "$LOG_DIR/$tool-$pipeline.stdout" 2>&1
    echo "$? $(( $(date +%s) - start ))" > "$LOG_DIR/$tool-$pipeline.rc"
  ) &
done
wait
for run in $runs; do
  tool=${run%%:*}
  pipeline=${run#*:}; [ "$pipeline" = "$run" ] && pipeline=tma
  log="$LOG_DIR/$tool-$pipeline.log"
  read -r rc secs < "$LOG_DIR/$tool-$pipeline.rc"
  summary_line=$(grep -h "ERROR SUMMARY" "$log" | tail -1)
  race_line=$(grep -h "RACECHECK SUMMARY" "$log" | tail -1)
  cases_line=$(grep -h "^run_cases:" "$LOG_DIR/$tool-$pipeline.stdout" | tail -1)
  [ -z "$summary_line" ] && [ "$tool" != racecheck ] && summary_line="ERROR SUMMARY: missing (see $log)"
  [ -z "$cases_line" ] && cases_line="run_cases.py did not complete (see $LOG_DIR/$tool-$pipeline.stdout)"
  printf '%-10s %s  [wgmma %s, exit %s, %ss]\n' "$tool:" "$summary_line" "$pipeline" "$rc" "$secs" >> "$SUMMARY"
  [ -n "$race_line" ] && printf '%-10s %s\n' "" "$race_line" >> "$SUMMARY"
  printf '%-10s %s\n' "" "$cases_line" >> "$SUMMARY"
  # racecheck reports hazards in its own summary line instead of an ERROR SUMMARY.
  clean_line=$summary_line
  [ "$tool" = racecheck ] && clean_line=$race_line
  if [ "$rc" -ne 0 ] || ! echo "$clean_line" | grep -qE "ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards" \
      || ! echo "$cases_line" | grep -q "calls OK"; then
    status=1
  fi
done
echo >> "$SUMMARY"
[ "$status" -eq 0 ] && echo "result: every run reports 0 errors" >> "$SUMMARY" || echo "result: FAILED (see $LOG_DIR)" >> "$SUMMARY"
cat "$SUMMARY"
exit $status
