#!/bin/bash
# $TARBALLS: a folder with `git archive` tarballs of the trees compared (<name>.tgz). Run from the repository root.
# H100: main (PDL) vs base (b92cb0f): GPU tests + sanitizers of main, probe A/B; block trace of the large cells.
cd "${REPO:-.}"  # the repository root
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name --format=csv,noheader
for n in base main trace; do
  mkdir -p /tmp/src-$n && tar xzf "$TARBALLS"/$( [ $n = trace ] && echo main || echo $n ).tgz -C /tmp/src-$n
done
(P=$PWD/benchmarks/results/nvidia-h200-20261127/decode-last-wave/trace/blocktrace.patch; cd /tmp/src-trace && (patch -p1 -s < $P || git apply $P)) || echo "patch failed"
for n in base main trace; do
  python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/$n -Cbuild-dir=/tmp/build-$n /tmp/src-$n -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build-$n.log 2>&1 &
done
wait
for n in base main trace; do test -d /tmp/$n/waveboost || { echo "$n build failed"; tail -20 /tmp/logs/build-$n.log; }; done
(cd /tmp/src-main && PYTHONPATH=/tmp/main timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_decode_gpu.py tests/test_kvcache.py tests/test_varlen.py tests/test_torch_serving.py tests/test_jax_integration.py tests/test_capabilities.py > /tmp/logs/pytest-main.txt 2>&1; echo "main pytest rc $?"; tail -1 /tmp/logs/pytest-main.txt; grep "^FAILED" /tmp/logs/pytest-main.txt | head -5)
(cd /tmp/src-main && PYTHONPATH=/tmp/main timeout 120 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_gpu.py tests/test_registry.py -k "decode or registry or plan or graph" > /tmp/logs/pytest-main2.txt 2>&1; echo "main pytest2 rc $?"; tail -1 /tmp/logs/pytest-main2.txt; grep "^FAILED" /tmp/logs/pytest-main2.txt | head -5)
for t in memcheck racecheck synccheck; do
(cd /tmp/src-main && PYTHONPATH=/tmp/main timeout 90 compute-sanitizer --tool $t python3 tests/sanitize/run_cases.py --serving-only > /tmp/logs/$t-main.log 2>&1; echo "main $t rc $?"; tail -1 /tmp/logs/$t-main.log)
done
SH=1x2048x32x8,1x32768x32x8,16x8192x32x8,128x2048x32x8,32x8192x32x1,1x2048x64x8,1x4096x64x8,64x4096x64x8
for r in 1 2; do for n in base main; do
  PYTHONPATH=/tmp/$n timeout 60 python3 benchmarks/decode_probe.py --tag $n --impls wb_blhd,sdpa_cudnn --shapes $SH >> /tmp/logs/probe.jsonl 2>>/tmp/logs/probe-err.txt
done; done
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/probe_table.py /tmp/logs/probe.jsonl | tee $OUT/probe.txt
PYTHONPATH=/tmp/trace timeout 120 python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/trace/bt_run.py 128x2048x32x8,64x4096x64x8,16x8192x32x8,32x8192x32x1,1x32768x32x8 > /tmp/logs/bt.txt 2>&1; echo "bt rc $?"
python3 benchmarks/results/nvidia-h200-20261127/decode-last-wave/trace/bt_tab.py /tmp/logs/bt.txt | tee $OUT/bt.txt
gzip -c /tmp/logs/bt.txt > $OUT/bt-raw.txt.gz
tar czf $OUT/logs.tgz -C /tmp logs --exclude bt.txt
