"""Where a call's time goes, for bench/peers.py's cells: the part the host
takes before the device starts, and the device's own.

Per implementation of each cell, medians (L2 evicted before every call):
- kernel µs: the profiler's device spans, as peers.py counts them;
- call µs: events around one call started with the device idle, as
  peers.py's call timing (here each implementation alone, not in turns);
- device µs: the same events with the call queued behind a sleep kernel
  that outlasts the host's work, so that they time the device only;
- host µs: call minus device, the wait before the device starts (and for
  any host work between its kernels).
The copy of the cell's bytes (torch.neg) is timed the same way, the least a
call of that traffic takes on this host.

    python3 bench/call_split.py --ops cross_entropy --dtypes bfloat16 --widths 50304
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SLEEP_CYCLES, environment, header, save_json  # noqa: E402
from peers import SHAPES, TRAFFIC, Meter, copy_kernel, definitions, liger, make_inputs, step  # noqa: E402


def split(meter: Meter, fn, reps: int) -> dict:
    call = statistics.median(meter.one_call_us(fn) for _ in range(reps))
    device = statistics.median(meter.one_call_us(fn, behind_sleep=SLEEP_CYCLES) for _ in range(reps))
    return {"kernel": meter.kernel_us({"fn": fn})["fn"], "call": call, "device": device, "host": call - device}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default="cross_entropy")
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--widths", help="only the shapes of these row widths")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    defs = definitions(liger())
    meter = Meter()
    widths = {int(w) for w in args.widths.split(",")} if args.widths else None
    env = environment()
    lines = ["| op | shape | dtype | pass | implementation | kernel µs | call µs | device µs | host µs |",
             "|---|---|---|---|---|---|---|---|---|"]
    print(header(env), *lines, sep="\n")
    cells = []
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    for op, dtype, shape, backward in [(op, dtype, shape, backward) for op in args.ops.split(",") for dtype in dtypes
                                       for shape in SHAPES[op] if widths is None or shape[-1] in widths
                                       for backward in (False, True)]:
        names, impls = defs[op]
        inputs = make_inputs(names, shape, dtype, backward)
        runs = {name: step(fn, inputs, backward) for name, fn in impls.items()}
        runs["copy of the bytes"] = copy_kernel(TRAFFIC[op][backward] * inputs[0].numel() * inputs[0].element_size())
        for name, run in runs.items():
            for _ in range(3):  # compiled and autotuned before anything is timed
                run()
            cell = {"op": op, "shape": list(shape), "dtype": str(dtype)[6:], "pass": "fwd+bwd" if backward else "fwd",
                    "implementation": name, **split(meter, run, args.reps)}
            cells.append(cell)
            lines.append(f"| {op} | {'x'.join(map(str, shape))} | {cell['dtype']} | {cell['pass']} | {name} | "
                         f"{cell['kernel']:.1f} | {cell['call']:.1f} | {cell['device']:.1f} | {cell['host']:.1f} |")
            print(lines[-1], flush=True)
        del runs, inputs
        torch.cuda.empty_cache()
    save_json("call_split.json", {"environment": env, "cells": cells, "markdown": "\n".join(lines)})


if __name__ == "__main__":
    main()
