#!/bin/bash
# mma backward: the step walk by a cursor (branch mma-bwd-cursor) against main, bf16, both head dims; the branch's backward tests.
cd "${REPO:-.}"
start=$(date +%s)
TARBALLS=.devrun bash benchmarks/build_trees.sh main cursor || exit 1
echo "built: $(( $(date +%s) - start )) s"
cd /tmp/src-cursor
PYTHONPATH=/tmp/cursor timeout 20 python3 benchmarks/ab_time.py smoke --pass bwd --backend mma --dtypes bf16 --head-dims 64,128 --seqlens 1024 --causal 1 --repeats 3 || { echo SMOKE FAILED; exit 1; }
(PYTHONPATH=/tmp/cursor timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py > $OUT/pytest-cursor.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest-cursor.txt) &
wait
B="--pass bwd --backend mma --dtypes bf16 --head-dims 64,128 --seqlens 1024,4096 --causal both --repeats 10"
for r in 1 2; do
  PYTHONPATH=/tmp/main timeout 40 python3 benchmarks/ab_time.py main $B >> $OUT/ab.txt 2>>$OUT/ab-err.txt
  PYTHONPATH=/tmp/cursor timeout 40 python3 benchmarks/ab_time.py cursor $B >> $OUT/ab.txt 2>>$OUT/ab-err.txt
done
python3 benchmarks/ab_table.py $OUT/ab.txt | tee $OUT/ab-table.txt
grep -E "^(FAILED|ERROR)" $OUT/pytest-cursor.txt | head; tail -2 $OUT/pytest-cursor.txt
echo "end: $(( $(date +%s) - start )) s"
