#!/usr/bin/env bash
# On the GPU machine: build, run the whole test suite, run the benchmarks, and
# leave logs and results under $OUT (at most 8 files come back).
#   bash scripts/gpu_check.sh [bench ...]    default: every benchmark
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fastreduce-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
benches=${*:-reduce ladder norms}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } 2>&1 | tee "$OUT/env.txt"

start=$(date +%s)
if ! MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
    python3 -m pip install --no-build-isolation --no-deps -e . >/tmp/build.log 2>&1; then
  grep -E "error|Error" /tmp/build.log | head -40
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"

python3 -m pytest -q -ra tests -p no:cacheprovider 2>&1 | tail -n 60 | tee "$OUT/tests.log"

python3 examples/gpt2.py 2>&1 | tee "$OUT/gpt2.txt"

for bench in $benches; do
  python3 "bench/$bench.py" 2>"/tmp/bench_$bench.err" | tee "$OUT/bench_$bench.md" || tail -20 "/tmp/bench_$bench.err"
done
python3 scripts/update_readme.py
tar czf "$OUT/results.tgz" bench/results README.md
