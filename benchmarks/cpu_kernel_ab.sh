#!/bin/bash
# Paired single-core timing of the AVX2 fp32 forward kernel of two git revisions (or "." for the
# working tree): builds benchmarks/cpu_kernel_ab.cpp against each tree's src/cpu and runs it.
# A/B > 1 means B is faster. See cpu_kernel_ab.cpp.
#
#   benchmarks/cpu_kernel_ab.sh main . 2048 128 8 0 16
set -euo pipefail
if [ $# -lt 7 ]; then
  echo "usage: $0 REV_A REV_B L D H causal rounds" >&2
  exit 1
fi
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in A B; do
  rev=$([ $side = A ] && echo "$1" || echo "$2")
  mkdir -p "$work/$side"
  if [ "$rev" = . ]; then
    cp -r "$root/src/cpu/." "$work/$side/"
  else
    git -C "$root" archive "$rev" src/cpu | tar -x -C "$work/$side" --strip-components=2
  fi
  g++ -O3 -std=c++17 -I"$root/include" -I"$work/$side" -DWAVEBOOST_AB_VARIANT=$side -Dcpu=cpu_$side \
    -c "$root/benchmarks/cpu_kernel_ab.cpp" -o "$work/$side.o"
done
g++ -O3 -std=c++17 "$root/benchmarks/cpu_kernel_ab.cpp" "$work/A.o" "$work/B.o" -o "$work/ab"
"$work/ab" "$3" "$4" "$5" "$6" "$7"
