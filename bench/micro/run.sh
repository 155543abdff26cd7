#!/usr/bin/env bash
# Builds bench/micro/warp_rows.cu once per register budget and runs each.
#   bash bench/micro/run.sh [budget ...]    default: none 48
set -euo pipefail
cd "$(dirname "$0")"
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
