"""Runs fuzz cases (tests/fuzz.py) in child processes, so that a crash fails
the case it happened in and names it; tests/test_fuzz.py runs its cases so.
From the command line, a range of case indices of every operator (or some),
printing each failure with the command that reruns it:

    python tests/fuzz_runner.py --device cpu --cases 139000 140000 --workers 2
"""

import argparse
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import fuzz

SANITIZER_PREFIX = "========="


def run_cases(device, jobs, wrap=(), env=None):
    """{(op, index): None or the failure}, restarting the child after a crash;
    `wrap` runs the child under a command (compute-sanitizer: its error
    reports fail the case they appear in)."""
    results, pending = {}, list(jobs)
    while pending:
        child = subprocess.run([*wrap, sys.executable, fuzz.__file__, "--worker", "--device", device],
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


def run_cases_in_parallel(device, jobs, workers=1, wrap=(), env=None):
    """run_cases over `workers` children at once, each given every workers-th
    job and its share of the cores (each child's torch would otherwise start a
    thread per core)."""
    if workers <= 1:
        return run_cases(device, jobs, wrap, env)
    env = dict(env or os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    with ThreadPoolExecutor(workers) as pool:
        shares = pool.map(lambda k: run_cases(device, jobs[k::workers], wrap, env), range(workers))
    return {job: outcome for share in shares for job, outcome in share.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", type=int, nargs=2, metavar=("FIRST", "END"), required=True)
    parser.add_argument("--ops", help="comma-separated operators (default: every one)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--wrap", default="", help="a command to run the children under")
    args = parser.parse_args()
    ops = args.ops.split(",") if args.ops else sorted(fuzz.OPS)
    jobs = [(op, i) for i in range(*args.cases) for op in ops]
    results = run_cases_in_parallel(args.device, jobs, args.workers, shlex.split(args.wrap))
    failures = sorted(job for job, outcome in results.items() if outcome)
    for op, i in failures:
        print(f"{fuzz.reproducer(op, i, args.device)}\n    {results[(op, i)]}")
    print(f"{len(jobs) - len(failures)} of {len(jobs)} cases hold")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
