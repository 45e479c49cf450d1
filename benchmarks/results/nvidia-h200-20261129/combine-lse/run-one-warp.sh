#!/usr/bin/env bash
# ncu (instruction and warp-state sections) of the one-warp combine on main and on the second change (v2);
# main's MQA 1 x 32k at MAX_SPLITS 64 / 128.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT; ONE=$PWD/benchmarks/results/nvidia-h200-20261129/combine-lse/one_step.py
TARBALLS=.devrun bash benchmarks/build_trees.sh mn v2 || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
for t in mn v2; do
  PYTHONPATH=/tmp/$t timeout 40 ncu --kernel-name regex:combine --launch-skip 1 --launch-count 1 --section SpeedOfLight --section InstructionStats --section WarpStateStats --section SchedulerStats --metrics smsp__inst_executed.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio python3 $ONE 8x16384x32x1 > $T/ncu-$t.txt 2>&1
  echo "$t: $(grep -E '^ +Duration|inst_executed.sum|Executed Instructions  ' $T/ncu-$t.txt | tr -s ' ' | tr '\n' ' ')"
done
echo "ncu $(( $(date +%s)-t0 )) s"
cd /tmp/src-mn/benchmarks
for s in 64 128; do WAVEBOOST_DECODE_MAX_SPLITS=$s PYTHONPATH=/tmp/mn timeout 40 python3 decode_probe.py --impls wb_blhd --tag s$s --shapes 1x32768x32x1,1x32768x64x1 >> $T/probe.jsonl 2>>$T/probe-err.txt; done
cat $T/probe.jsonl
echo "total $(( $(date +%s)-t0 )) s"
