#!/usr/bin/env bash
# On the GPU machine: build, run the CUDA tests, the GPT-2 example, the
# kernel micro-benchmark and the benchmarks, and leave logs and results under
# $OUT (the device tool brings back at most 8 files: past 8, they are packed
# into $OUT/logs.tgz).
#   bash scripts/gpu_check.sh [step ...]
# Steps, in this order: build tests cpp fuzz memcheck racecheck host gpt2 llama
# micro reduce stats ladder gpt2_rows llm_rows peers; default: all but the two sanitizer steps.
# A `run` that carries .device_build (made on the development machine by
# scripts/device_build.sh from the same sources) skips the build.
# Benches write to build/bench-results; after any benchmark step they are
# published into docs/results (scripts/update_readme.py) and results.tgz.
# The build here is for sm_90 only (the H100/H200), to save minutes; CI
# builds the default architectures.
# A bench that outlives one call (bench/stats.py after a fresh build): start
# it as `FASTREDUCE_RESULTS_DIR=/tmp/results nohup python3 bench/stats.py >
# /tmp/statistics.md &`, then, from the next call (at once: an idle machine goes
# back after 30 s), copy /tmp/results/*.json and /tmp/statistics.md into $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fastreduce-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
steps=" ${*:-build tests cpp fuzz host gpt2 llama micro reduce stats ladder gpt2_rows llm_rows peers} "
want() { [[ $steps == *" $1 "* ]]; }

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } 2>&1 | tee "$OUT/env.txt"

# A carried .device_build serves while it was built from these sources; a
# warm machine keeps the last build; otherwise a fresh one needs it whatever
# was asked.
if [[ -f .device_build/sources.sha256 && $(bash scripts/source_hash.sh) == $(cat .device_build/sources.sha256) ]] &&
    ! want build; then
  cp .device_build/*.so .device_build/_build_info.py fastreduce_torch/
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  echo "build: carried (.device_build)"
fi
python3 -c "import fastreduce_torch" 2>/dev/null || steps+="build "
if want build; then
  start=$(date +%s)
  if ! MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
      python3 -m pip install --no-build-isolation --no-deps -e . >/tmp/build.log 2>&1; then
    grep -E "error|Error" /tmp/build.log | head -40
    exit 1
  fi
  echo "build: $(( $(date +%s) - start )) s"
fi
# The CUDA tests only (the CPU ones run on any machine, CI's included; the
# whole suite outlasts a call here: 10 minutes were not enough).
want tests && python3 -m pytest -q -ra -m cuda tests -p no:cacheprovider 2>&1 | tail -n 60 | tee "$OUT/tests.log"
# The C++ tests (API on CPU and CUDA, the example, AOTInductor from C++).
want cpp && MAX_JOBS=16 make cpp-test PYTHON=python3 2>&1 | grep -v "^\[\|^--\|gmake" | tail -n 60 | tee "$OUT/cpp.log"
# The fuzz suite's CUDA cases past the 40 the tests run, in four children at
# once (one child: 400 cases an op in 78 s on an H200; four, by a scratch
# runner: 2000 an op in 89 s). FUZZ_CASES and FUZZ_WORKERS set them.
want fuzz && FASTREDUCE_FUZZ_CASES=${FUZZ_CASES:-1000} FASTREDUCE_FUZZ_WORKERS=${FUZZ_WORKERS:-4} \
  python3 -m pytest -q -p no:cacheprovider -m cuda \
  tests/test_fuzz.py -k cuda 2>&1 | grep -E "^E +(python|    output|    case)|passed|failed" | tee "$OUT/fuzz.log"
# compute-sanitizer over the CUDA norm, loss and autograd tests (compiled ones left
# out: Inductor's own kernels are not ours to check; so are the freed-objects
# and peak-memory tests, whose objects host backtraces kept alive: not yet
# rerun with device frames only). torch's own kernels are not
# checked either (their mangled names hold `2at6native`): racecheck reports
# hazards in its float64 reduce_kernel, which the tests' references run at
# 262144-wide rows. Reports keep device frames only: a host backtrace keeps
# the Python frames of the call that allocated alive, and with them their
# tensors (test_losses under memcheck held 82 GB after 170 tests; with device
# frames alone, 774 MiB throughout). Without the caching allocator, so that a
# read past a buffer's end is past its allocation; a process per test file.
# A caller's `-k` joins the exclusions (pytest keeps only the last -k given).
sanitize() {
  local tool=$1 files=() select="not compile and not free_what_they_saved and not memory"
  shift
  while (($#)); do
    if [[ $1 == -k ]]; then select="($2) and $select"; shift 2; else files+=("$1"); shift; fi
  done
  for file in "${files[@]}"; do
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool "$tool" --show-backtrace device --error-exitcode 9 --kernel-name-exclude kns=2at6native \
      python3 -m pytest -q -x -p no:cacheprovider -m cuda -k "$select" "$file" 2>&1 | tail -n 15 | tee -a "$OUT/$tool.log"
  done
}
want memcheck && sanitize memcheck tests/test_norms.py tests/test_softmax.py tests/test_autograd.py tests/test_losses.py \
  tests/test_fused_linear_cross_entropy.py
# The fuzz suite's CUDA cases (special values, device mixes, bad arguments),
# each child process under memcheck: a report fails the case it appears in.
want memcheck && FASTREDUCE_FUZZ_WRAP="compute-sanitizer --tool memcheck --error-exitcode 9" \
  python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_fuzz.py 2>&1 | tail -n 40 | tee -a "$OUT/memcheck.log"
want memcheck && sanitize memcheck tests/test_statistics.py tests/test_reductions.py \
  -k "full or dim or extremes or (moments and float32) or (logsumexp and bfloat16) or (norm and float16) or argmax or aminmax or any or foreach or clip or graph or plan_shapes"
want racecheck && sanitize racecheck tests/test_statistics.py -k "moments and float32 or argmax or foreach"
want racecheck && sanitize racecheck tests/test_norms.py tests/test_softmax.py tests/test_losses.py \
  -k "backward_matches or parameters_dtype or (long_rows and float32) or (add_norm and bfloat16) or (every_option and 50304) or (rows_in_turn and bfloat16)"
want gpt2 && python3 examples/gpt2.py 2>&1 | tee "$OUT/gpt2.txt"
want llama && python3 examples/llama.py 2>&1 | tee "$OUT/llama.txt"
want micro && { bash bench/micro/run.sh cross_entropy; bash bench/micro/run.sh wide_rows; } 2>&1 | tee "$OUT/micro.md"

benched=0
for bench in host reduce stats ladder gpt2_rows llm_rows peers; do
  want "$bench" || continue
  benched=1
  python3 "bench/$bench.py" 2>"/tmp/bench_$bench.err" | tee "$OUT/bench_$bench.md" || tail -20 "/tmp/bench_$bench.err"
done
if [[ $benched == 1 ]]; then
  python3 scripts/update_readme.py
  tar czf "$OUT/results.tgz" docs/results docs/results.md README.md
fi
if (( $(find "$OUT" -type f | wc -l) > 8 )); then
  (cd "$OUT" && tar czf /tmp/logs.tgz . && find . -mindepth 1 -delete && mv /tmp/logs.tgz .)
fi
