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

import fuzz
import pytest
import torch
from conftest import AVX512_CPU_KERNELS, DEVICES, requires_cuda
from fuzz_runner import run_cases, run_cases_in_parallel

CASES = int(os.environ.get("FASTREDUCE_FUZZ_CASES", "40"))
WORKERS = int(os.environ.get("FASTREDUCE_FUZZ_WORKERS", "1"))
WRAP = shlex.split(os.environ.get("FASTREDUCE_FUZZ_WRAP", ""))


# Where the AVX-512 CPU kernels load (csrc/torch/cpu_capability.cpp), the
# base ones run only when ATEN_CPU_CAPABILITY lowers torch's capability.
BASE_CPU_KERNELS_IDLE = torch.backends.cpu.get_cpu_capability() == "AVX512" and os.path.exists(AVX512_CPU_KERNELS)


@pytest.fixture(scope="module")
def outcomes():
    cache = {}

    def of(device, capability=None):
        if (device, capability) not in cache:
            jobs = [(op, i) for op in sorted(fuzz.OPS) for i in range(CASES)]
            env = dict(os.environ, ATEN_CPU_CAPABILITY=capability) if capability else None
            cache[device, capability] = run_cases_in_parallel(device, jobs, WORKERS, WRAP, env)
        return cache[device, capability]

    return of


def assert_cases_hold(op, device, results):
    failures = [f"{fuzz.reproducer(op, i, device)}\n    {results[(op, i)]}\n    case: {fuzz.describe(op, i, device)}"
                for i in range(CASES) if results.get((op, i))]
    assert len([i for i in range(CASES) if (op, i) in results]) == CASES
    assert not failures, f"{len(failures)} of {CASES} cases differ from torch:\n" + "\n".join(failures)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", sorted(fuzz.OPS))
def test_fuzz(op, device, outcomes):
    assert_cases_hold(op, device, outcomes(device))


@pytest.mark.skipif(not BASE_CPU_KERNELS_IDLE, reason="test_fuzz's CPU cases ran the base CPU kernels")
@pytest.mark.parametrize("op", sorted(fuzz.OPS))
def test_fuzz_base_cpu_kernels(op, outcomes):
    assert_cases_hold(op, "cpu", outcomes("cpu", capability="avx2"))


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
