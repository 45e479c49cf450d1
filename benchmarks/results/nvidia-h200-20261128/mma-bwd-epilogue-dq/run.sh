#!/bin/bash
# First call of the next session: (1) branch plan-persistent (plan()'s "persistent" key; the launch's
# persistent condition through wgmma_ws_persistent_shape) under the wgmma and registry GPU tests;
# (2) where the mma backward's main kernel spills at head dim 128 (SASS of main's bwd_mma unit).
# (3) branch mma-bwd-epilogue (dK/dV through the core's store_key_rows; its sm_90 cubin differs from main's):
# the backward tests and an A/B against main.
# (4) branch mma-bwd-dq-v2 (dQ by red.v2 of each lane's pairs, no shuffles; the ncu reading had 56x the
# LSU-queue stalls of FlashAttention-2 at head dim 64): its backward tests and an A/B against main.
# One pytest run at a time (two beside each other ran the GPU out of memory once).
# Needs $TARBALLS/{planp,epi,dqv2,main}.tgz (git archive BRANCH | gzip; regenerate if a branch moves).
cd "${REPO:-.}"
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
TARBALLS=${TARBALLS:?folder of the git archive tarballs} bash benchmarks/build_trees.sh planp epi dqv2 main || exit 1
echo "built: $(( $(date +%s) - start )) s"
cd /tmp/src-planp
(PYTHONPATH=/tmp/planp timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_wgmma_pipeline.py tests/test_registry.py tests/test_gpu.py tests/test_varlen.py > $OUT/pytest-planp.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest-planp.txt) &
obj=$(find /tmp/build-planp -name "bwd_mma.cu.o" | head -1)
cuobjdump -sass "$obj" > /tmp/bwd.sass 2>&1
python3 - <<'PY' > $OUT/bwd-spills.txt
import re
txt = open("/tmp/bwd.sass").read()
for f in re.split(r"\n\s+Function : ", txt)[1:]:
    name = f.split("\n")[0]
    if "flash_bwd_mma_kernel" not in name or "Li128ELi64ELb0ELb0E" not in name:
        continue
    lines = [l for l in f.split("\n") if re.search(r"/\*[0-9a-f]{4}\*/", l)]
    print(name, len(lines), "instructions")
    for i, l in enumerate(lines):
        if re.search(r"\b(LDL|STL)\b", l):
            print("----")
            for c in lines[max(0, i - 4): i + 3]:
                print(c.strip()[:150])
PY
head -c 20000 $OUT/bwd-spills.txt | head -150
wait
(cd /tmp/src-epi && PYTHONPATH=/tmp/epi timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_backward_gpu.py > $OUT/pytest-epi.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest-epi.txt)
(cd /tmp/src-dqv2 && PYTHONPATH=/tmp/dqv2 timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_backward_gpu.py > $OUT/pytest-dqv2.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest-dqv2.txt)
B="--pass bwd --backend mma --dtypes bf16 --head-dims 64,128 --seqlens 1024,4096 --causal both --repeats 10"
for r in 1 2; do
  PYTHONPATH=/tmp/main timeout 40 python3 benchmarks/ab_time.py main $B >> $OUT/ab-epi.txt 2>&1
  PYTHONPATH=/tmp/epi timeout 40 python3 benchmarks/ab_time.py epi $B >> $OUT/ab-epi.txt 2>&1
  PYTHONPATH=/tmp/main timeout 40 python3 benchmarks/ab_time.py main $B >> $OUT/ab-dqv2.txt 2>&1
  PYTHONPATH=/tmp/dqv2 timeout 40 python3 benchmarks/ab_time.py dqv2 $B >> $OUT/ab-dqv2.txt 2>&1
done
# (5) the mma backward's deterministic=True against its default on main (issue 12: at most 1.3x)
for r in 1 2; do
  PYTHONPATH=/tmp/main timeout 40 python3 benchmarks/ab_time.py default $B >> $OUT/ab-det.txt 2>&1
  PYTHONPATH=/tmp/main timeout 60 python3 benchmarks/ab_time.py deterministic $B --deterministic >> $OUT/ab-det.txt 2>&1
done
python3 benchmarks/ab_table.py $OUT/ab-det.txt | tail -10
python3 benchmarks/ab_table.py $OUT/ab-epi.txt | tail -3
python3 benchmarks/ab_table.py $OUT/ab-dqv2.txt
for f in pytest-planp pytest-epi pytest-dqv2; do grep -E "^(FAILED|ERROR)" $OUT/$f.txt | head; tail -2 $OUT/$f.txt; done
echo "end: $(( $(date +%s) - start )) s"
