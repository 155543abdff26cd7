#!/usr/bin/env bash
# Registers and spills of every kernel the launchers compile (sm_90, the
# build's flags), here against a base commit: prints the kernels whose count
# changed. No GPU needed. A kernel that gains registers can lose blocks an
# SM: 824ef77 took float32 layer_norm's loose read-twice kernel from 64 to
# 82 registers, and (4096, 8191) from 72 to 82 µs, unseen for a session.
#   bash scripts/kernel_registers.sh [base]     (default base: HEAD)
# Takes about 8 minutes on two cores (norms.cu twice dominates).
set -euo pipefail
base=${1:-HEAD}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add -q -f --detach "$work/base" "$base" >/dev/null

# "kernel registers spill-bytes" a line, sorted, for the tree at $1.
usage() {
  for source in "$1"/csrc/launch/*.cu; do
    nvcc -std=c++17 -O3 --expt-relaxed-constexpr -lineinfo -arch=sm_90 -Xptxas -v -c -o /dev/null "$source" 2>&1 || exit 1
  done | awk '
    /Compiling entry function/ { name = $0; sub(/.*function \047/, "", name); sub(/\047.*/, "", name) }
    /bytes spill stores/ { spill = $5 }
    /Used [0-9]+ registers/ && name != "" { print name, $5, spill; name = "" }' | sort -u
}
usage "$work/base" > "$work/before" &
base_job=$!
usage . > "$work/after"
wait "$base_job"
changed=$(join -a1 -a2 -e - -o 0,1.2,1.3,2.2,2.3 "$work/before" "$work/after" | awk '$2 != $4 || $3 != $5')
if [[ -z $changed ]]; then
  echo "registers and spills unchanged from $base ($(wc -l < "$work/after") kernels)"
  exit 0
fi
echo "kernel | registers $base -> tree | spill bytes $base -> tree"
echo "$changed" | awk '{ printf "%s | %s -> %s | %s -> %s\n", $1, $2, $4, $3, $5 }' | c++filt
