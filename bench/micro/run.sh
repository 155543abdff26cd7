#!/usr/bin/env bash
# Builds and runs one kernel probe on the GPU machine (no torch: the kernel
# headers alone), printing a markdown table.
#   bash bench/micro/run.sh cross_entropy    cross_entropy_passes.cu
#   bash bench/micro/run.sh wide_rows        wide_rows.cu
#   bash bench/micro/run.sh cluster_rows     cluster_rows.cu
#   bash bench/micro/run.sh softmax_rows     softmax_rows.cu
#   bash bench/micro/run.sh norm_forward     norm_forward.cu
#   bash bench/micro/run.sh norm_backward    norm_backward.cu
#   bash bench/micro/run.sh softmax_forward  softmax_forward.cu
#   bash bench/micro/run.sh stream_shapes    stream_shapes.cu
#   bash bench/micro/run.sh norm_row_variants norm_row_variants.cu
#   bash bench/micro/run.sh pipelined_rows   pipelined_rows.cu
#   bash bench/micro/run.sh pipelined_softmax pipelined_softmax.cu
#   bash bench/micro/run.sh pipelined_norm   pipelined_norm.cu
#   bash bench/micro/run.sh pipelined_softmax_backward pipelined_softmax_backward.cu
#   bash bench/micro/run.sh short_rows       short_rows.cu
#   bash bench/micro/run.sh param_loads      param_loads.cu
#   bash bench/micro/run.sh affine_rows      affine_rows.cu
#   bash bench/micro/run.sh staged_add       staged_add.cu
#   bash bench/micro/run.sh float_rows       float_rows.cu
#   bash bench/micro/run.sh full_rows        full_rows.cu
#   bash bench/micro/run.sh reread_rows      reread_rows.cu
#   bash bench/micro/run.sh column_walk      column_walk.cu
#   bash bench/micro/run.sh column_finish    column_finish.cu
#   bash bench/micro/run.sh costly_folds     costly_folds.cu
#   bash bench/micro/run.sh row_sums         row_sums.cu
#   bash bench/micro/run.sh head_rows        head_rows.cu
#   bash bench/micro/run.sh loose_reread     loose_reread.cu
#   bash bench/micro/run.sh loose_forward    loose_forward.cu
#   bash bench/micro/run.sh add_reread       add_reread.cu
#   bash bench/micro/run.sh pipelined_blocks pipelined_blocks.cu
#   bash bench/micro/run.sh one_block_rows   one_block_rows.cu
#   bash bench/micro/run.sh walk_rows        walk_rows.cu
# --compile-all compiles every probe's own source (no GPU needed; CI runs it
# so that probes do not go stale as the kernels' arguments change).
set -euo pipefail
cd "$(dirname "$0")"
if [ "${1:-}" = --compile-all ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  ls ./*.cu | xargs -P "$(nproc)" -I{} sh -c \
    'nvcc -O3 -std=c++17 --expt-relaxed-constexpr -arch=sm_90 -c -o "$1/$(basename "$2" .cu).o" "$2" || exit 255' _ "$out" {}
  echo "bench/micro: $(ls "$out" | wc -l) probes compiled"
  exit 0
fi
case ${1:-} in
  cross_entropy) sources="cross_entropy_passes.cu ../../csrc/launch/cross_entropy.cu ../../csrc/launch/arrival_counters.cu" ;;
  wide_rows) sources="wide_rows.cu" ;;
  cluster_rows) sources="cluster_rows.cu" ;;
  softmax_rows) sources="softmax_rows.cu" ;;
  norm_forward) sources="norm_forward.cu ../../csrc/launch/norms.cu" ;;
  norm_backward) sources="norm_backward.cu ../../csrc/launch/norms.cu" ;;
  softmax_forward) sources="softmax_forward.cu ../../csrc/launch/softmax.cu" ;;
  stream_shapes) sources="stream_shapes.cu" ;;
  norm_row_variants) sources="norm_row_variants.cu ../../csrc/launch/norms.cu" ;;
  pipelined_rows) sources="pipelined_rows.cu ../../csrc/launch/norms.cu" ;;
  pipelined_softmax) sources="pipelined_softmax.cu ../../csrc/launch/softmax.cu" ;;
  pipelined_norm) sources="pipelined_norm.cu ../../csrc/launch/norms.cu" ;;
  pipelined_softmax_backward) sources="pipelined_softmax_backward.cu ../../csrc/launch/softmax.cu" ;;
  short_rows) sources="short_rows.cu ../../csrc/launch/norms.cu" ;;
  param_loads) sources="param_loads.cu ../../csrc/launch/norms.cu" ;;
  affine_rows) sources="affine_rows.cu ../../csrc/launch/norms.cu" ;;
  staged_add) sources="staged_add.cu ../../csrc/launch/norms.cu" ;;
  float_rows) sources="float_rows.cu ../../csrc/launch/norms.cu" ;;
  full_rows) sources="full_rows.cu ../../csrc/launch/norms.cu" ;;
  reread_rows) sources="reread_rows.cu ../../csrc/launch/norms.cu" ;;
  column_walk) sources="column_walk.cu ../../csrc/launch/arrival_counters.cu" ;;
  column_finish) sources="column_finish.cu ../../csrc/launch/arrival_counters.cu" ;;
  costly_folds) sources="costly_folds.cu ../../csrc/launch/arrival_counters.cu" ;;
  row_sums) sources="row_sums.cu ../../csrc/launch/arrival_counters.cu" ;;
  head_rows) sources="head_rows.cu ../../csrc/launch/norms.cu" ;;
  loose_reread) sources="loose_reread.cu ../../csrc/launch/norms.cu" ;;
  loose_forward) sources="loose_forward.cu ../../csrc/launch/norms.cu" ;;
  add_reread) sources="add_reread.cu ../../csrc/launch/norms.cu" ;;
  pipelined_blocks) sources="pipelined_blocks.cu ../../csrc/launch/cross_entropy.cu ../../csrc/launch/softmax.cu ../../csrc/launch/norms.cu ../../csrc/launch/arrival_counters.cu" ;;
  one_block_rows) sources="one_block_rows.cu ../../csrc/launch/norms.cu" ;;
  walk_rows) sources="walk_rows.cu ../../csrc/launch/norms.cu" ;;
  *) echo "usage: bash bench/micro/run.sh cross_entropy|wide_rows|cluster_rows|softmax_rows|norm_forward|norm_backward|softmax_forward|stream_shapes|norm_row_variants|pipelined_rows|pipelined_softmax|pipelined_norm|pipelined_softmax_backward|short_rows|param_loads|affine_rows|staged_add|float_rows|full_rows|reread_rows|column_walk|column_finish|costly_folds|row_sums|head_rows|loose_reread|loose_forward|add_reread|pipelined_blocks|one_block_rows|walk_rows" >&2; exit 2 ;;
esac
nvcc -O3 -std=c++17 --expt-relaxed-constexpr -arch=sm_90 -o "/tmp/probe_$1" $sources
"/tmp/probe_$1" "${@:2}"
