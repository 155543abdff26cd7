#!/usr/bin/env bash
# Builds and runs the kernel probes on the GPU machine.
#   bash bench/micro/run.sh [budget ...]     warp_rows.cu once per register budget (default: none 48)
#   bash bench/micro/run.sh cross_entropy    cross_entropy_passes.cu
#   bash bench/micro/run.sh wide_rows        wide_rows.cu
set -euo pipefail
cd "$(dirname "$0")"
if [[ ${1:-} == cross_entropy ]]; then
  nvcc -O3 -std=c++17 --expt-relaxed-constexpr -arch=sm_90 -o /tmp/cross_entropy_passes \
    cross_entropy_passes.cu ../../csrc/launch/cross_entropy.cu
  exec /tmp/cross_entropy_passes
fi
if [[ ${1:-} == wide_rows ]]; then
  nvcc -O3 -std=c++17 --expt-relaxed-constexpr -arch=sm_90 -o /tmp/wide_rows wide_rows.cu
  exec /tmp/wide_rows
fi
budgets=${*:-none 48}
for r in $budgets; do
  flag=$([ "$r" = none ] && echo "" || echo "-maxrregcount=$r")
  nvcc -O3 -std=c++17 --expt-relaxed-constexpr -arch=sm_90 $flag -o "/tmp/warp_rows_$r" warp_rows.cu &
done
wait
for r in $budgets; do
  echo "### register budget: $r"
  "/tmp/warp_rows_$r"
done
