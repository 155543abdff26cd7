"""Timing and reporting shared by the benchmarks.

Timing: CUDA events around each call, the L2 evicted before each call by
*reading* a buffer several times its size (a write-flush leaves dirty lines
that slow mid sizes), warm-up first, median of the repetitions. The eviction
read also gives the host a head start: while the GPU reads `flush_mb`, the
host issues the timed call, so the events time GPU work, not host overhead,
as long as issuing the call takes less than that read (256 MB: ~90 µs; an
autograd backward with Python hooks needs a larger one).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable

import torch

# JSONs and plots go to build/bench-results (ignored by git), so a run leaves
# the checkout clean; `python3 scripts/update_readme.py` publishes them into
# docs/results. FASTREDUCE_RESULTS_DIR moves them elsewhere: a bench left
# running across GPU-machine calls must write outside the working tree, which
# each call replaces.
RESULTS_DIR = os.environ.get("FASTREDUCE_RESULTS_DIR") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "bench-results")


# A sleep kernel that outlasts any benchmarked call's host work (cycles:
# about 2 ms at the H100's clock): queued before a call, it leaves events
# around the call timing the device alone.
SLEEP_CYCLES = 4_000_000


class Timer:
    def __init__(self, flush_mb: int = 256, spin_up_s: float = 2.0):
        self.flush = torch.empty(flush_mb * 2**20 // 4, dtype=torch.float32, device="cuda").uniform_()
        self.sink = torch.empty((), device="cuda")
        # Bring the clocks up from idle before the first timed call.
        begin = datetime.datetime.now()
        while (datetime.datetime.now() - begin).total_seconds() < spin_up_s:
            for _ in range(50):
                self.evict_l2()
            torch.cuda.synchronize()

    def evict_l2(self) -> None:
        torch.amax(self.flush, 0, out=self.sink)

    def median_us(self, fn: Callable[[], object], reps: int = 30, warmup: int = 3, budget_s: float = 2.0,
                  behind_sleep: int = 0) -> float:
        """With `behind_sleep` cycles, each call is queued behind a sleep kernel
        that outlasts the host's work, so that the events time the device alone
        (calls whose host work outlasts the eviction read)."""
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        events = []
        start_time = datetime.datetime.now()
        for i in range(reps):
            self.evict_l2()
            if behind_sleep:
                torch.cuda._sleep(behind_sleep)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            events.append((begin, end))
            if i >= 5 and (datetime.datetime.now() - start_time).total_seconds() > budget_s:
                break
        torch.cuda.synchronize()
        return statistics.median(b.elapsed_time(e) for b, e in events) * 1e3


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    driver = "unknown"
    try:
        import subprocess

        driver = subprocess.check_output(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], text=True
        ).strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return {
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }


def cpu_environment() -> dict:
    """The CPU benchmarks' provenance: processor, threads, torch."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": model,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }


def header(env: dict) -> str:
    if "gpu" not in env:
        return f"{env['cpu']}, {env['threads']} threads, torch {env['torch']}, {env['date']}; `{env['command']}`"
    return (
        f"{env['gpu']} ({env['sms']} SMs), driver {env['driver']}, torch {env['torch']}, "
        f"CUDA {env['cuda']}, {env['date']}; `{env['command']}`"
    )


def print_table(title: str, columns: list[str], rows: list[list]) -> str:
    """Prints and returns a Markdown table."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
        return str(v)

    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    return text


def save_json(name: str, payload: dict) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, name)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    return path


def progress(iterable, label: str, total: int | None = None):
    """A one-line progress counter on stderr (no extra dependency). Items are
    taken lazily, so a generator's item is used before the next is made."""
    total = total if total is not None else len(iterable)
    for i, item in enumerate(iterable):
        print(f"\r{label}: {i + 1}/{total}", end="", file=sys.stderr, flush=True)
        yield item
    print(file=sys.stderr)
