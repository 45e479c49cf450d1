#!/bin/bash
# $TARBALLS: a folder with `git archive` tarballs of the trees compared (<name>.tgz). Run from the repository root.
# main (base) vs decode-tail-rule (br): the branch's decode tests + memcheck, its plans, probe A/B two rounds.
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
bash benchmarks/build_trees.sh main br-tail exp
SH=20x8192x32x8,24x8192x32x8,17x16384x32x8,34x4096x32x8,40x4096x32x8,36x2048x64x8,72x2048x32x8,48x4096x32x8,128x2048x32x8,16x8192x32x8
PYTHONPATH=/tmp/br-tail python3 - $SH <<'PY' | tee $OUT/plans.txt
import sys, torch, waveboost
for s in sys.argv[1].split(","):
    B, L, H, HKV = map(int, s.split("x"))
    q = torch.empty(B, 1, H, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(B, L, HKV, 128, device="cuda", dtype=torch.bfloat16)
    print(s, waveboost.plan(q, k, k))
PY
(cd /tmp/src-br-tail && PYTHONPATH=/tmp/br-tail timeout 200 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py > /tmp/logs/pytest-br.txt 2>&1; echo "br pytest rc $?"; tail -1 /tmp/logs/pytest-br.txt; grep "^FAILED" /tmp/logs/pytest-br.txt | head -5)
(cd /tmp/src-br-tail && PYTHONPATH=/tmp/br-tail timeout 100 compute-sanitizer --tool memcheck python3 -m pytest -q -p no:cacheprovider tests/test_decode_gpu.py -k "past_one_wave" > /tmp/logs/memcheck-br.log 2>&1; echo "br memcheck rc $?"; grep "ERROR SUMMARY" /tmp/logs/memcheck-br.log; tail -1 /tmp/logs/memcheck-br.log)
for r in 1 2; do for n in main br-tail; do
  IM=wb_blhd; [ $n = main ] && IM=wb_blhd,sdpa_cudnn
  PYTHONPATH=/tmp/$n timeout 120 python3 benchmarks/decode_probe.py --tag $n --impls $IM --shapes $SH >> /tmp/logs/probe.jsonl 2>>/tmp/logs/probe-err.txt
done; done
tail -3 /tmp/logs/probe-err.txt
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/probe.jsonl | tee $OUT/probe.txt
cp /tmp/logs/probe.jsonl $OUT/
tar czf $OUT/logs.tgz -C /tmp logs
SW=20x8192x32x8,24x8192x32x8,17x16384x32x8,34x4096x32x8,40x4096x32x8,36x2048x64x8,48x4096x32x8,72x2048x32x8
for fs in 1 2 3 4 5 6 8; do
  WAVEBOOST_DECODE_FORCE_SPLITS=$fs PYTHONPATH=/tmp/exp timeout 100 python3 benchmarks/decode_probe.py --tag fs$fs --impls wb_blhd --shapes $SW >> /tmp/logs/sweep.jsonl 2>>/tmp/logs/probe-err.txt
done
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/sweep.jsonl | tee $OUT/sweep.txt
cp /tmp/logs/sweep.jsonl $OUT/
