#!/bin/bash
# main vs the branch decode-last-wave-resident (br-res): tests, plans, probe. $TARBALLS: git archive of each (main.tgz, br-res.tgz).
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
bash benchmarks/build_trees.sh main br-res
SH=160x8192x32x1,140x4096x32x1,200x4096x32x1,32x8192x32x1,20x8192x32x8,128x2048x32x8
for n in main br-res; do PYTHONPATH=/tmp/$n python3 - $SH,16x8192x32x8,64x4096x64x8,1x2048x32x8 <<'PY' | tee -a $OUT/plans.txt
import sys, torch, waveboost
for s in sys.argv[1].split(","):
    B, L, H, HKV = map(int, s.split("x"))
    q = torch.empty(B, 1, H, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(B, L, HKV, 128, device="cuda", dtype=torch.bfloat16)
    print(s, waveboost.__file__.split("/")[2], waveboost.plan(q, k, k))
PY
done
(cd /tmp/src-br-res && PYTHONPATH=/tmp/br-res timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py > /tmp/logs/pytest-br.txt 2>&1; echo "br pytest rc $?"; tail -1 /tmp/logs/pytest-br.txt)
for r in 1 2; do for n in main br-res; do
  PYTHONPATH=/tmp/$n timeout 100 python3 benchmarks/decode_probe.py --tag $n --impls wb_blhd --shapes $SH >> /tmp/logs/probe.jsonl 2>>/tmp/logs/probe-err.txt
done; done
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/probe.jsonl | tee $OUT/probe.txt
cp /tmp/logs/*.jsonl /tmp/logs/pytest-br.txt $OUT/
