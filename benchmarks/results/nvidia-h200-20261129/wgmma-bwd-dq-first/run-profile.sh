#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh new || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
n=ours-causal-16k
PYTHONPATH=/tmp/new timeout 200 ncu --set full --import-source no -k regex:flash_bwd_wgmma_ws_kernel --launch-skip 1 --launch-count 1 -o /tmp/t/$n \
  python3 /tmp/src-new/benchmarks/ab_time.py x --pass bwd --backend wgmma --dtypes bf16 --head-dims 128 --seqlens 16384 --causal 1 --repeats 1 > /tmp/t/$n.log 2>&1
tail -2 /tmp/t/$n.log
ncu --import /tmp/t/$n.ncu-rep --page source --print-source sass --csv > /tmp/t/$n.csv 2>/dev/null
python3 benchmarks/ncu_stalls.py /tmp/t/$n.csv 60 > /tmp/t/stalls-$n.txt 2>&1
ncu --import /tmp/t/$n.ncu-rep --page details > /tmp/t/details-$n.txt 2>&1
gzip -f /tmp/t/$n.csv; rm -f /tmp/t/$n.ncu-rep
head -12 /tmp/t/stalls-$n.txt; grep -E "^\s+(Duration|Executed Instructions |Issue Slots Busy|Registers Per Thread|Executed Ipc A)" /tmp/t/details-$n.txt | head -6
grep -E "Shared is the highest" /tmp/t/details-$n.txt | head -2
tar czf $OUT/c13.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
