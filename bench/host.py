"""Host time per call: what a user pays to issue each fastreduce op against its
aten counterpart, on tiny tensors where the kernel takes less time than the
call. Eager with and without an input that requires grad, and under
inference_mode; on CUDA (when present) and the CPU.

Timing: `calls` back-to-back calls timed with perf_counter (CUDA kernels
queue and run faster than the host issues them, so the loop times the host);
the fastest of `trials` such loops, the host's own cost least disturbed by
the rest of the machine (medians moved by up to 1.5x between runs).

    python bench/host.py [--calls 2000] [--trials 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import fastreduce_torch as fr
from common import cpu_environment, environment, header, print_table, save_json


def cases(device: str):
    x = torch.randn(64, 256, device=device)
    w, b = torch.randn(256, device=device), torch.randn(256, device=device)
    s = torch.randn(1, 64, 64, device=device)
    r = torch.randn(64, 256, device=device)
    target = torch.randint(0, 256, (64,), device=device)
    return [
        ("sum(x, -1)", x, lambda t: fr.sum(t, -1), lambda t: torch.sum(t, -1)),
        ("sum(x)", x, lambda t: fr.sum(t), lambda t: torch.sum(t)),
        ("mean(x, -1)", x, lambda t: fr.mean(t, -1), lambda t: torch.mean(t, -1)),
        ("prod(x, -1)", x, lambda t: fr.prod(t, -1), lambda t: torch.prod(t, -1)),
        ("amax(x, -1)", x, lambda t: fr.amax(t, -1), lambda t: torch.amax(t, -1)),
        ("amin(x, -1)", x, lambda t: fr.amin(t, -1), lambda t: torch.amin(t, -1)),
        ("layer_norm(x, 256, w, b)", x, lambda t: fr.layer_norm(t, 256, w, b),
         lambda t: F.layer_norm(t, (256,), w, b)),
        ("softmax(x, -1)", x, lambda t: fr.softmax(t, -1), lambda t: torch.softmax(t, -1)),
        # Against one aten softmax: the masked_fill it replaces would add a call.
        ("causal_softmax(s) vs softmax(s)", s, lambda t: fr.causal_softmax(t, 0.5), lambda t: torch.softmax(t, -1)),
        ("rms_norm(x, 256, w)", x, lambda t: fr.rms_norm(t, 256, w), lambda t: F.rms_norm(t, (256,), w)),
        ("add_rms_norm(x, r, 256, w) vs add + rms_norm", x, lambda t: fr.add_rms_norm(t, r, 256, w),
         lambda t: F.rms_norm(t + r, (256,), w)),
        ("cross_entropy(x, target)", x, lambda t: fr.cross_entropy(t, target), lambda t: F.cross_entropy(t, target)),
    ]


def per_call_us(fn, x, calls: int, trials: int, device: str) -> float:
    for _ in range(50):
        fn(x)
    if device == "cuda":
        torch.cuda.synchronize()
    samples = []
    for _ in range(trials):
        begin = time.perf_counter()
        for _ in range(calls):
            fn(x)
        samples.append((time.perf_counter() - begin) / calls * 1e6)
        if device == "cuda":
            torch.cuda.synchronize()
    return min(samples)


MODES = ("no grad", "requires grad", "inference_mode")


def medium_cases():
    """Sizes where host and GPU time are of the same order: the time per call
    of back-to-back calls, synchronised at the end, is what a loop feels."""
    v = torch.randn(1 << 20, device="cuda")
    x = torch.randn(8192, 768, device="cuda")
    w, b = torch.randn(768, device="cuda"), torch.randn(768, device="cuda")
    return [
        ("sum 2^20 float32", v, lambda t: fr.sum(t), lambda t: torch.sum(t)),
        ("layer_norm (8192, 768) float32", x, lambda t: fr.layer_norm(t, 768, w, b),
         lambda t: F.layer_norm(t, (768,), w, b)),
    ]


def per_call_synced_us(fn, x, calls: int, trials: int) -> float:
    samples = []
    for _ in range(trials):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - begin) / calls * 1e6)
    return statistics.median(samples)


def run(device: str, calls: int, trials: int):
    rows = []
    for name, x, ours, theirs in cases(device):
        row = [name]
        for mode in MODES:
            t = x.detach().clone().requires_grad_(mode == "requires grad")
            if mode == "inference_mode":
                with torch.inference_mode():
                    a, o = per_call_us(theirs, t, calls, trials, device), per_call_us(ours, t, calls, trials, device)
            else:
                a, o = per_call_us(theirs, t, calls, trials, device), per_call_us(ours, t, calls, trials, device)
            row += [a, o, a / o]
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=25)
    args = parser.parse_args()
    columns = ["call"] + [f"{m}: {w}" for m in MODES for w in ("aten µs", "ours µs", "aten/ours")]
    markdown = ""
    payload = {}
    devices = (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]
    for device in devices:
        env = environment() if device == "cuda" else cpu_environment()
        rows = run(device, args.calls, args.trials)
        title = f"Host time per call, {device} (64x256 float32; fastest of {args.trials} loops of {args.calls} calls)"
        markdown += print_table(title, columns, rows) + "\n"
        payload[device] = {"environment": env, "rows": rows}
    if torch.cuda.is_available():
        rows = []
        for name, x, ours, theirs in medium_cases():
            for grad in (False, True):
                t = x.detach().clone().requires_grad_(grad)
                a = per_call_synced_us(theirs, t, 200, args.trials)
                o = per_call_synced_us(ours, t, 200, args.trials)
                rows.append([name + (", requires grad" if grad else ""), a, o, a / o])
        title = f"Time per call of 200 back-to-back calls, cuda (median of {args.trials})"
        markdown += print_table(title, ["call", "aten µs", "ours µs", "aten/ours"], rows) + "\n"
        payload["medium"] = rows
    payload["environment"] = environment() if torch.cuda.is_available() else cpu_environment()
    payload["markdown"] = markdown
    save_json("host.json", payload)
    print(header(payload["environment"]))


if __name__ == "__main__":
    main()
