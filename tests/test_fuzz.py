"""The differential fuzz suite (tests/fuzz.py): every operator and backward
operator against torch's counterpart, in child processes so that a crash
fails the case it happened in and names it.

FASTREDUCE_FUZZ_CASES sets the cases per operator (default 40);
FASTREDUCE_FUZZ_WORKERS the children run at once (default 1), each with its
share of the cores; FASTREDUCE_FUZZ_WRAP runs the children under a command,
e.g. `compute-sanitizer --tool memcheck`, whose error reports fail the case
they appear in."""

import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import fuzz
from conftest import DEVICES, requires_cuda

CASES = int(os.environ.get("FASTREDUCE_FUZZ_CASES", "40"))
WORKERS = int(os.environ.get("FASTREDUCE_FUZZ_WORKERS", "1"))
WRAP = shlex.split(os.environ.get("FASTREDUCE_FUZZ_WRAP", ""))
SANITIZER_PREFIX = "========="


def run_cases(device, jobs, env=None):
    """{(op, index): None or the failure}, restarting the child after a crash."""
    results, pending = {}, list(jobs)
    while pending:
        child = subprocess.run([*WRAP, sys.executable, fuzz.__file__, "--worker", "--device", device],
                               input="".join(f"{op} {i}\n" for op, i in pending), capture_output=True, text=True,
                               env=env)
        current = None
        for line in child.stdout.splitlines():
            if line.startswith("start "):
                _, op, index = line.split()
                current = (op, int(index))
            elif current and line == "ok":
                results.setdefault(current, None)
                current = None
            elif current and line.startswith("fail "):
                results[current] = line[5:]
                current = None
            elif line.startswith(SANITIZER_PREFIX) and "ERROR SUMMARY: 0 errors" not in line:
                last = current or next(reversed(results), None)
                if last and ("Invalid" in line or "Error" in line or "error" in line):
                    results[last] = (results.get(last) or "") + " sanitizer: " + line[len(SANITIZER_PREFIX):].strip()
        if current:
            tail = " | ".join(child.stderr.strip().splitlines()[-3:])
            results[current] = f"crashed the process (exit {child.returncode}): {tail}"
        elif child.returncode and not any(results.get(j) for j in pending):
            results[pending[-1]] = f"the child exited {child.returncode}: {child.stderr.strip()[-300:]}"
        pending = [job for job in pending if job not in results]
    return results


def run_cases_in_parallel(device, jobs, workers=WORKERS):
    """run_cases over `workers` children at once, each given every workers-th
    job and its share of the cores (each child's torch would otherwise start a
    thread per core)."""
    if workers <= 1:
        return run_cases(device, jobs)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    with ThreadPoolExecutor(workers) as pool:
        shares = pool.map(lambda k: run_cases(device, jobs[k::workers], env), range(workers))
    return {job: outcome for share in shares for job, outcome in share.items()}


@pytest.fixture(scope="module")
def outcomes(request):
    cache = {}

    def of(device):
        if device not in cache:
            cache[device] = run_cases_in_parallel(device, [(op, i) for op in sorted(fuzz.OPS) for i in range(CASES)])
        return cache[device]

    return of


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", sorted(fuzz.OPS))
def test_fuzz(op, device, outcomes):
    results = outcomes(device)
    failures = [f"{fuzz.reproducer(op, i, device)}\n    {results[(op, i)]}\n    case: {fuzz.describe(op, i, device)}"
                for i in range(CASES) if results.get((op, i))]
    assert len([i for i in range(CASES) if (op, i) in results]) == CASES
    assert not failures, f"{len(failures)} of {CASES} cases differ from torch:\n" + "\n".join(failures)


def test_children_in_parallel_give_one_child_s_outcomes():
    # Case 392 of rms_norm_backward differs from torch (a documented class), the others hold.
    jobs = [("rms_norm_backward", 392), ("sum", 1), ("prod", 5), ("any", 3), ("norm", 2)]
    parallel = run_cases_in_parallel("cpu", jobs, workers=2)
    assert parallel == run_cases("cpu", jobs) and set(parallel) == set(jobs)


def test_cases_are_reproducible():
    assert fuzz.describe("layer_norm", 7, "cpu") == fuzz.describe("layer_norm", 7, "cpu")
    assert fuzz.check("sum", 3, "cpu") is None or fuzz.check("sum", 3, "cpu") == fuzz.check("sum", 3, "cpu")
    assert torch.equal(fuzz.Case("sum", 3, "cpu").values([5], torch.float32),
                       fuzz.Case("sum", 3, "cpu").values([5], torch.float32))


@requires_cuda
@pytest.mark.cuda
def test_cuda_cases_replay_on_the_cpu():
    # `--drawn-as cuda` on the CPU draws a CUDA case's choices and values.
    for op in ("layer_norm", "rms_norm_backward", "cross_entropy", "prod_backward", "sum"):
        for i in range(40):
            assert fuzz.describe(op, i, "cpu", drawn_as="cuda") == fuzz.describe(op, i, "cuda")
