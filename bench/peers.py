"""Every row operator against its peers, side by side in one process: eager
torch, torch.compile of the same code and Liger-Kernel (an optional import:
its column is left out when the package is missing), forward and forward +
backward, float32 and bfloat16, at GPT-2, LLM and head-size shapes.

Two timings per cell, both medians:
- kernel µs: the profiler's device spans of one call, summed (every kernel
  the call launches, the L2 evicted before it by a read the sum leaves out),
  over three rounds of three calls of each implementation in turn;
- call µs: CUDA events around one call as a user makes it, started with the
  device idle and the L2 evicted, so the launch and the host work of the
  call count too; the implementations take turns, call by call, so that the
  host's drift (tens of µs at short rows) reaches them alike, in orders of
  a balanced Latin square: each takes every place in a turn, and follows
  every other, equally often (a forward + backward call ran ~10% slower in
  the last place of a turn than in the first, whichever it was, and the
  call after a Triton peer's may start with the host's caches cold).
Copy of the bytes: an element-wise kernel moving as many bytes as the
cell's traffic (half read, half written), timed both ways: the limit a
kernel of that traffic meets here (reads alone run ~2% faster).
Peak MiB: the growth of max_memory_allocated over one call beyond its
inputs, the previous call's gradients freed. "vs best" is the best peer's
time over fastreduce's (above 1: fastreduce is faster); GB/s counts the
bytes the op must move (forward: read x, write y; forward + backward adds
the backward's reads and writes) in kernel time; the copy column is the
card's own limit (H100: 3024 GB/s, ANCHORS.md; H200: about 4330).

    python3 bench/peers.py [--ops rms_norm,softmax] [--dtypes bfloat16] [--widths 65536] [--append]
                           [--flush write]
    python3 bench/peers.py --summary docs/results/peers.json
    python3 bench/peers.py --misses docs/results/peers_h100.json

--append adds this run's cells to the last run's JSON (a bench split over
several calls of a GPU machine) and prints the table of all of them.
--flush write evicts the L2 by writing 1 GiB instead of reading it: the
L2 then holds dirty lines (as after a model's previous layer), which a
kernel's writes must first send to memory; after a read, its writes take
clean lines for free and may still sit in the L2 when it ends. The two
rank peers differently at short rows (torch.compile's add + layer_norm at
(8192, 768) bf16: 14.0 µs after a read, 19-20 after a write). Its JSON is
peers_write_flush.json.
--summary prints where a saved run's cells stand against the best peer (the
counts on exact ratios, each cell behind by 5% or more) without running;
--misses lists every cell that misses one of issue 31's targets, beside the
copy of its bytes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys

import torch
import torch._dynamo
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastreduce_torch as fr  # noqa: E402
from common import RESULTS_DIR, environment, header, progress, save_json  # noqa: E402

COPY_GBS = 3024.0
ROWS = [(8192, 768), (8192, 1600), (8192, 4096), (32768, 1024), (4096, 8192)]
# Very wide rows (wide hidden sizes, long-vocabulary softmax), 2^27 elements each.
WIDE = [(8192, 16384), (4096, 32768), (2048, 65536), (1024, 131072), (512, 262144)]
# Head-size rows, 2^25 elements each: the query and key norms of heads of 128
# and 256, a router's softmax over 128 experts.
HEAD = [(262144, 128), (131072, 256)]
# Widths that are not whole 16-byte packs (odd hidden sizes, GPT-2's vocabulary).
ODD = [(8192, 4095), (4096, 8191)]
SHAPES = {
    "layer_norm": ROWS + WIDE + HEAD + ODD, "rms_norm": ROWS + WIDE + HEAD + ODD, "add_layer_norm": ROWS,
    "add_rms_norm": ROWS, "softmax": ROWS + WIDE + HEAD + ODD + [(8192, 50257)],
    "causal_softmax": [(64, 1024, 1024), (16, 2048, 2048)],
    # GPT-2's own vocabulary too: rows that are not whole 16-byte packs.
    "cross_entropy": [(8192, 50304), (8192, 50257), (4096, 128256), (2048, 262144)],
}
# Elements moved per element of the input: (forward, forward + backward).
TRAFFIC = {"layer_norm": (2, 5), "rms_norm": (2, 5), "add_layer_norm": (4, 8), "add_rms_norm": (4, 8),
           "softmax": (2, 5), "causal_softmax": (2, 5), "cross_entropy": (1, 2)}
IMPLS = ["eager", "torch.compile", "Liger", "fastreduce"]
EPS = 1e-6


def liger():
    try:
        from liger_kernel.transformers import functional
        return functional
    except ImportError:
        return None


def add_then(norm):
    def step(x, r, *params):
        h = x + r
        return norm(h, *params), h
    return step


def definitions(lg):
    """op -> (make inputs, {impl: function of the inputs}); a peer without the op is left out."""
    def layer(x, w, b):
        return F.layer_norm(x, x.shape[-1:], w, b, EPS)

    def rms(x, w):
        return F.rms_norm(x, x.shape[-1:], w, EPS)

    def causal(s, scale):
        upper = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        return torch.softmax((s * scale).masked_fill(upper, float("-inf")), -1)

    defs = {
        "layer_norm": ("x w b", {"eager": layer, "fastreduce": lambda x, w, b: fr.layer_norm(x, x.shape[-1], w, b, EPS),
                                 "Liger": lg and (lambda x, w, b: lg.liger_layer_norm(x, w, b, EPS))}),
        "rms_norm": ("x w", {"eager": rms, "fastreduce": lambda x, w: fr.rms_norm(x, x.shape[-1], w, EPS),
                             "Liger": lg and (lambda x, w: lg.liger_rms_norm(x, w, EPS))}),
        "add_layer_norm": ("x r w b", {
            "eager": add_then(layer),
            "fastreduce": lambda x, r, w, b: fr.add_layer_norm(x, r, x.shape[-1], w, b, EPS),
            "Liger": lg and add_then(lambda h, w, b: lg.liger_layer_norm(h, w, b, EPS))}),
        "add_rms_norm": ("x r w", {
            "eager": add_then(rms),
            "fastreduce": lambda x, r, w: fr.add_rms_norm(x, r, x.shape[-1], w, EPS),
            "Liger": lg and (lambda x, r, w: lg.liger_fused_add_rms_norm(x, r, w, EPS))}),
        "softmax": ("x", {"eager": lambda x: torch.softmax(x, -1), "fastreduce": lambda x: fr.softmax(x, -1),
                          "Liger": lg and lg.liger_softmax}),
        "causal_softmax": ("x scale", {"eager": causal, "fastreduce": fr.causal_softmax}),
        "cross_entropy": ("x target", {"eager": F.cross_entropy, "fastreduce": fr.cross_entropy,
                                       "Liger": lg and (lambda x, t: lg.liger_cross_entropy(x, t))}),
    }
    for name, (args, impls) in defs.items():
        impls["torch.compile"] = torch.compile(impls["eager"], dynamic=False)
        defs[name] = (args, {k: impls[k] for k in IMPLS if impls.get(k)})
    return defs


def make_inputs(names: str, shape, dtype, grad: bool):
    n = shape[-1]
    made = {
        "x": lambda: torch.randn(shape, device="cuda", dtype=dtype) * (4 if len(shape) == 2 and n > 20000 else 1),
        "r": lambda: torch.randn(shape, device="cuda", dtype=dtype),
        "w": lambda: torch.rand(n, device="cuda", dtype=dtype) + 0.5,
        "b": lambda: torch.randn(n, device="cuda", dtype=dtype) * 0.1,
    }
    inputs = []
    for name in names.split():
        if name == "target":
            inputs.append(torch.randint(0, n, shape[:1], device="cuda"))
        elif name == "scale":
            inputs.append(n ** -0.5)
        else:
            inputs.append(made[name]().requires_grad_(grad))
    return inputs


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of 0..n-1 (Williams' Latin square) in which each index takes each
    place, and directly follows each other index, equally often: 0, 1, n-1, 2,
    n-2, ... shifted by one per row; for odd n also each row reversed."""
    first = [0]
    low, high = 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(i + shift) % n for i in first] for shift in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 else rows


class Meter:
    def __init__(self, write_flush: bool = False):
        self.flush = torch.empty(2**28, dtype=torch.float32, device="cuda").uniform_()  # 1 GiB
        self.write_flush = write_flush
        # kernel_us splits the profile at the read probes: a write flush is
        # bracketed by two probes of a few bytes, so that its own kernel
        # falls between calls.
        self.marker = self.flush[:1024]

    def evict_l2(self):
        if self.write_flush:
            torch.ops.fastreduce._read_probe(self.marker)
            self.flush.zero_()
            torch.ops.fastreduce._read_probe(self.marker)
        else:
            torch.ops.fastreduce._read_probe(self.flush)

    def call_us(self, fns: dict, reps=24, warmup=1):
        """Median per-call µs of each function, taken in turns whose orders
        (balanced_orders) give every implementation each place in a turn and
        each predecessor alike, and so the host's slow drift too."""
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        names = list(fns)
        orders = balanced_orders(len(names))
        times = {name: [] for name in names}
        for rep in range(reps):
            for index in orders[rep % len(orders)]:
                name = names[index]
                times[name].append(self.one_call_us(fns[name]))
        return {name: statistics.median(t) for name, t in times.items()}

    def one_call_us(self, fn, behind_sleep: int = 0) -> float:
        """µs between events around one call of fn, made with the L2 evicted and
        the device idle; with `behind_sleep` cycles, the call is queued behind a
        sleep kernel that outlasts the host's work, so that the events time the
        device alone."""
        self.evict_l2()
        torch.cuda.synchronize()
        if behind_sleep:
            torch.cuda._sleep(behind_sleep)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) * 1e3

    def kernel_us(self, fns: dict, rounds=3, reps=3):
        """Median device µs per call of each function: `rounds` profiles, in
        each `reps` calls of every function in turn, their order rotating
        (balanced_orders) so that the GPU's drift between rounds (up to 7%
        from one run to the next at short rows) reaches them alike."""
        from torch.profiler import ProfilerActivity, profile

        names = list(fns)
        orders = balanced_orders(len(names))
        samples = {name: [] for name in names}
        for turn in range(rounds):
            sequence = [names[index] for index in orders[turn % len(orders)] for _ in range(reps)]
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for name in sequence:
                    self.evict_l2()
                    fns[name]()
                    torch.cuda.synchronize()
            for name, us in zip(sequence, self.calls_device_us(prof.events(), len(sequence))):
                samples[name].append(us)
        return {name: statistics.median(t) for name, t in samples.items()}

    def calls_device_us(self, events, calls: int) -> list[float]:
        """The device µs of each of `calls` profiled calls: the spans between
        one call's eviction probes and the next's, summed."""
        per_call = [0.0] * calls
        spans = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA),
                       key=lambda e: e.time_range.start)
        probes_per_call = 2 if self.write_flush else 1
        probes = 0
        for e in spans:
            if "read_probe" in e.name:
                probes += 1
            elif probes > 0 and probes % probes_per_call == 0 and probes // probes_per_call <= calls:
                per_call[probes // probes_per_call - 1] += e.device_time
        return per_call

    @staticmethod
    def peak_mib(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20


def step(fn, inputs, backward: bool):
    """One call: the forward, or the forward and its gradients (then freed)."""
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not backward:
        return lambda: fn(*inputs)
    probe = fn(*inputs)
    outputs = list(probe) if isinstance(probe, tuple) else [probe]
    grads = [None if o.dim() == 0 else torch.randn_like(o) for o in outputs]
    del probe, outputs

    def run():
        out = fn(*inputs)
        out = list(out) if isinstance(out, tuple) else [out]
        torch.autograd.grad(out, leaves, grads)
    return run


def copy_kernel(nbytes: int):
    """A kernel-only probe of `nbytes` of traffic: an element-wise kernel (a
    negation) reading half of them and writing the other half. (Not
    cudaMemcpy: the profiler's span of a large one runs longer than the copy
    takes between events.)"""
    src = torch.empty(nbytes // 8, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)

    def copy():
        torch.neg(src, out=dst)
    return copy


def measure(defs, ops, dtypes, widths, meter):
    cells = [(op, shape, dtype, backward) for op in ops for dtype in dtypes for shape in SHAPES[op]
             if widths is None or shape[-1] in widths for backward in (False, True)]
    rows = []
    for op, shape, dtype, backward in progress(cells, "peers"):
        names, impls = defs[op]
        inputs = make_inputs(names, shape, dtype, backward)
        result = {"op": op, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
                  "pass": "fwd+bwd" if backward else "fwd", "call_us": {}, "kernel_us": {}, "peak_mib": {}}
        runs = {}
        for impl, fn in impls.items():
            try:
                runs[impl] = step(fn, inputs, backward)
                for _ in range(3):  # compiled, autotuned and cached before anything is timed
                    runs[impl]()
                result["peak_mib"][impl] = meter.peak_mib(runs[impl])
            except Exception as error:  # a peer that cannot run the cell: recorded, not fatal
                result.setdefault("failed", {})[impl] = f"{type(error).__name__}: {str(error)[:120]}"
                runs.pop(impl, None)
        elements = 1
        for s in shape:
            elements *= s
        size = torch.empty((), dtype=dtype).element_size()
        result["bytes"] = TRAFFIC[op][backward] * elements * size
        # The copy of the cell's traffic takes its turns with the
        # implementations: the limit a kernel of this traffic meets on this
        # GPU in this run.
        copy = copy_kernel(result["bytes"])
        copy()
        kernel = meter.kernel_us({**runs, "copy": copy})
        result["copy_us"] = {"kernel": kernel.pop("copy"), "call": meter.call_us({"copy": copy})["copy"]}
        result["kernel_us"] = kernel
        result["call_us"] = meter.call_us(runs)
        del runs, copy
        torch.cuda.empty_cache()
        rows.append(result)
    return rows


def ratio(cell: dict, timing: str) -> float | None:
    times = cell[timing]
    others = [v for k, v in times.items() if k != "fastreduce"]
    return min(others) / times["fastreduce"] if others and "fastreduce" in times else None


def copy_ratio(cell: dict) -> float | None:
    """A forward's kernel time against the copy of its bytes (1: the copy's rate)."""
    ours = cell["kernel_us"].get("fastreduce")
    return cell["copy_us"]["kernel"] / ours if cell["pass"] == "fwd" and "copy_us" in cell and ours else None


def cell_name(c: dict) -> str:
    return f"{c['op']} ({', '.join(map(str, c['shape']))}) {c['dtype']} {c['pass']}"


def summary(rows) -> str:
    """Where the cells stand against the best peer, both timings, on the exact
    ratios (the table prints them to two places), and the forwards against the
    copy of their bytes."""
    lines = []
    for timing, what in (("kernel_us", "kernel"), ("call_us", "per call")):
        rated = [(r, c) for c in rows if (r := ratio(c, timing)) is not None]
        behind = sorted((r, cell_name(c)) for r, c in rated if r < 0.95)
        lines.append(f"{what}: at or ahead of the best peer in {sum(r >= 1 for r, _ in rated)} of {len(rated)} "
                     f"cells, within 3% in {sum(r >= 0.97 for r, _ in rated)}, behind by 5% or more in {len(behind)}"
                     + "".join(f"\n  {r:.3f} {n}" for r, n in behind))
    forwards = [r for c in rows if (r := copy_ratio(c)) is not None]
    near_copy = sum(r >= 0.95 for r in forwards)
    lines.append(f"forwards at >= 95% of the copy of their bytes (kernel): {near_copy} of {len(forwards)}")
    return "\n".join(lines) + "\n"


# Issue 31's per-call targets for cross-entropy forward + backward (bf16):
# 90% of the rate of one read of the logits and one write of the gradient.
CALL_TARGETS_US = {("cross_entropy", (8192, 50304), "bfloat16", "fwd+bwd"): 620.0,
                   ("cross_entropy", (4096, 128256), "bfloat16", "fwd+bwd"): 780.0}


def misses(rows) -> str:
    """Every cell that misses a target of issue 31, worst first within each
    target, beside the copy of its bytes timed in the same run (the limit a
    kernel of that traffic meets): behind the best peer in kernel or call
    time, a forward under 95% of the copy's rate, a call over its target."""
    found = []
    for timing, what in (("kernel_us", "kernel behind the best peer"), ("call_us", "call behind the best peer")):
        for c in rows:
            if (r := ratio(c, timing)) is not None and r < 1:
                best = min((v, k) for k, v in c[timing].items() if k != "fastreduce")
                found.append((what, r, c, c[timing]["fastreduce"], f"{best[0]:.1f} ({best[1]})"))
    for c in rows:
        if (r := copy_ratio(c)) is not None and r < 0.95:
            found.append(("forward under 95% of the copy", r, c, c["kernel_us"]["fastreduce"],
                          f"{c['copy_us']['kernel'] / 0.95:.1f}"))
        if (target := CALL_TARGETS_US.get(cell_key(c))) and (ours := c["call_us"].get("fastreduce")) > target:
            found.append(("call over its target", target / ours, c, ours, f"{target:.0f}"))
    order = {w: i for i, w in enumerate(["kernel behind the best peer", "call behind the best peer",
                                         "forward under 95% of the copy", "call over its target"])}
    lines = ["| target missed | cell | fastreduce µs | target µs | ratio | copy of the bytes µs (kernel / call) |",
             "|---|---|---|---|---|---|"]
    for what, r, c, ours, target in sorted(found, key=lambda f: (order[f[0]], f[1])):
        copy = f"{c['copy_us']['kernel']:.1f} / {c['copy_us']['call']:.1f}" if "copy_us" in c else ""
        lines.append(f"| {what} | {cell_name(c)} | {ours:.1f} | {target} | {r:.3f} | {copy} |")
    return "\n".join(lines) + "\n"


def cell_key(c):
    return c["op"], tuple(c["shape"]), c["dtype"], c["pass"]


def table(rows) -> str:
    def fmt(v):
        return "" if v is None else f"{v:.1f}" if v >= 100 else f"{v:.2f}"

    columns = (["op", "shape", "dtype", "pass"] + [f"{i} call µs" for i in IMPLS] + ["vs best (call)"]
               + [f"{i} kernel µs" for i in IMPLS] + ["vs best (kernel)", "GB/s (kernel)",
                                                            "copy of the bytes µs (kernel / call)", "peak MiB ours / best"])
    lines = []
    for c in rows:
        ours = c["kernel_us"].get("fastreduce")
        peers_peak = [v for k, v in c["peak_mib"].items() if k != "fastreduce"]
        peak = f"{c['peak_mib'].get('fastreduce', float('nan')):.0f} / {min(peers_peak):.0f}" if peers_peak else ""
        copy = f"{fmt(c['copy_us']['kernel'])} / {fmt(c['copy_us']['call'])}" if "copy_us" in c else ""
        lines.append([c["op"], "x".join(map(str, c["shape"])), c["dtype"], c["pass"]]
                     + [fmt(c["call_us"].get(i)) for i in IMPLS] + [fmt(ratio(c, "call_us"))]
                     + [fmt(c["kernel_us"].get(i)) for i in IMPLS] + [fmt(ratio(c, "kernel_us"))]
                     + [f"{c['bytes'] / ours / 1e3:.0f}" if ours else "", copy, peak])
    return columns, lines


def table_markdown(columns, lines) -> str:
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(rows + ["| " + " | ".join(map(str, line)) + " |" for line in lines]) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(SHAPES))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--widths", help="only the shapes of these row widths, e.g. 65536,262144")
    parser.add_argument("--append", action="store_true")
    parser.add_argument("--flush", choices=["read", "write"], default="read")
    parser.add_argument("--summary", metavar="JSON", help="print where a saved run's cells stand, and exit")
    parser.add_argument("--misses", metavar="JSON", help="print every cell of a saved run that misses a target, and exit")
    args = parser.parse_args()
    if args.summary or args.misses:
        with open(args.summary or args.misses) as f:
            cells = json.load(f)["cells"]
        print((summary if args.summary else misses)(cells), end="")
        return
    torch._dynamo.config.cache_size_limit = 256
    torch._dynamo.config.accumulated_cache_size_limit = 4096
    lg = liger()
    if lg is None:
        print("liger-kernel not installed: its column is left out", file=sys.stderr)
    env = environment()
    env["liger"] = importlib.metadata.version("liger-kernel") if lg else None
    env["l2_flush"] = args.flush
    defs, meter = definitions(lg), Meter(write_flush=args.flush == "write")
    name = "peers.json" if args.flush == "read" else "peers_write_flush.json"
    path = os.path.join(RESULTS_DIR, name)
    rows = []
    if args.append and os.path.exists(path):
        with open(path) as f:
            rows = json.load(f)["cells"]
    title = "### fastreduce against its peers (µs; vs best: the best peer's time over ours)\n\n"
    widths = args.widths and {int(w) for w in args.widths.split(",")}
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    for op in args.ops.split(","):  # saved after each op: a run cut short keeps what it measured
        # A cell measured again takes the old one's place in the table.
        fresh = {cell_key(c): c for c in measure(defs, [op], dtypes, widths, meter)}
        rows = [fresh.pop(cell_key(c), c) for c in rows] + list(fresh.values())
        text = title + table_markdown(*table(rows))
        save_json(name, {"environment": env, "cells": rows, "markdown": text})
    print(header(env))
    print(text)
    print(summary(rows), end="")


if __name__ == "__main__":
    main()
