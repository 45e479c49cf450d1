#!/bin/bash
# $TARBALLS: a folder with `git archive` tarballs of the trees compared (<name>.tgz). Run from the repository root.
# H200: main (9569424 rule) vs br-fill (hybrid): br-fill tests; dense plans of both; paged-16 probe A/B.
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
bash benchmarks/build_trees.sh main br-fill
SP=20x8192x32x8,17x16384x32x8,34x4096x32x8,40x4096x32x8,48x4096x32x8,72x2048x32x8,36x2048x64x8,128x2048x32x8
for n in main br-fill; do PYTHONPATH=/tmp/$n python3 - $SP <<'PY' | tee -a $OUT/plans.txt
import sys, torch, waveboost
for s in sys.argv[1].split(","):
    B, L, H, HKV = map(int, s.split("x"))
    q = torch.empty(B, 1, H, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(B, L, HKV, 128, device="cuda", dtype=torch.bfloat16)
    print(s, waveboost.__file__.split("/")[2], waveboost.plan(q, k, k)["num_splits"])
PY
done
(cd /tmp/src-br-fill && PYTHONPATH=/tmp/br-fill timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py > /tmp/logs/pytest-br.txt 2>&1; echo "br pytest rc $?"; tail -1 /tmp/logs/pytest-br.txt; grep "^FAILED" /tmp/logs/pytest-br.txt | head -5)
for r in 1 2; do for n in main br-fill; do
  PYTHONPATH=/tmp/$n timeout 100 python3 benchmarks/decode_probe.py --tag p16-$n --page-size 16 --impls wb_blhd --shapes $SP >> /tmp/logs/paged.jsonl 2>>/tmp/logs/probe-err.txt
done; done
tail -3 /tmp/logs/probe-err.txt
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/paged.jsonl | tee $OUT/paged.txt
cp /tmp/logs/*.jsonl /tmp/logs/pytest-br.txt $OUT/
