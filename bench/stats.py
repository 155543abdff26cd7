"""The reduction family against torch and torch.compile: var_mean, std,
logsumexp, norm (ord 2), argmax, aminmax, any and all over a full reduction,
rows and tall columns; each op's full reduction at 2^28 float32 against the
read ceiling; foreach_norm and clip_grad_norm_ on GPT-2's parameter shapes.

Bandwidth counts the input once plus the outputs. Ratio = torch time / our
time (above 1: we are faster); compile = torch.compile(torch op) time / ours.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastreduce_torch as fr  # noqa: E402
from common import SLEEP_CYCLES, Timer, environment, header, print_table, progress, save_json  # noqa: E402

OPS = {  # name: (fastreduce, torch), both called as f(x, dim)
    "var_mean": (lambda x, d: fr.var_mean(x, d), lambda x, d: torch.var_mean(x, d)),
    "std": (lambda x, d: fr.std(x, d), lambda x, d: torch.std(x, d)),
    "logsumexp": (lambda x, d: fr.logsumexp(x, d if d is not None else list(range(x.dim()))),
                  lambda x, d: torch.logsumexp(x, d if d is not None else list(range(x.dim())))),
    "norm": (lambda x, d: fr.norm(x, 2, d), lambda x, d: torch.linalg.vector_norm(x, 2, d)),
    "argmax": (lambda x, d: fr.argmax(x, d), lambda x, d: torch.argmax(x, d)),
    "aminmax": (lambda x, d: fr.aminmax(x, dim=d), lambda x, d: torch.aminmax(x, dim=d)),
    "any": (lambda x, d: fr.any(x, d), lambda x, d: torch.any(x, d) if d is not None else torch.any(x)),
    "all": (lambda x, d: fr.all(x, d), lambda x, d: torch.all(x, d) if d is not None else torch.all(x)),
}
CASES = [((2**25,), None), ((8192, 8192), 1), ((65536, 768), 0), ((65536, 128), 0)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def input_for(op, shape, dtype):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    if op in ("any", "all"):  # the answer needs the whole read: no early non-zero (any), no zero (all)
        return (x.abs() < 1e-30) if op == "any" else (x.abs() > -1)
    return x


def bytes_moved(x, out):
    outs = out if isinstance(out, tuple) else (out,)
    return x.numel() * x.element_size() + sum(o.numel() * o.element_size() for o in outs)


def op_rows(timer):
    rows = []
    for name, (ours, theirs) in progress(OPS.items(), "ops", len(OPS)):
        for shape, dim in CASES:
            for dtype_name, dtype in DTYPES.items():
                x = input_for(name, shape, dtype)
                torch._dynamo.reset()  # a fresh compile per case, not recompiles of one lambda
                compiled = torch.compile(lambda t, f=theirs, d=dim: f(t, d), fullgraph=True)
                t_ours = timer.median_us(lambda: ours(x, dim), 50)
                t_torch = timer.median_us(lambda: theirs(x, dim), 50)
                t_compiled = timer.median_us(lambda: compiled(x), 50)
                moved = bytes_moved(x, ours(x, dim))
                rows.append({"op": name, "dtype": dtype_name if name not in ("any", "all") else "bool",
                             "shape": list(shape), "dim": dim, "ours_us": t_ours, "torch_us": t_torch,
                             "compile_us": t_compiled, "ours_gbs": moved / t_ours / 1e3,
                             "ratio": t_torch / t_ours, "compile_ratio": t_compiled / t_ours})
                if name in ("any", "all"):
                    break  # one bool input, not one per float dtype
    return rows


def ceiling_rows(timer):
    """Each op's full reduction of 2^28 float32 against the read probe (the
    fastest read of the same bytes; ladder.py's ceiling)."""
    x = torch.randn(2**28, device="cuda")
    probe = timer.median_us(lambda: torch.ops.fastreduce._read_probe(x), 20)
    rows = [{"op": "read probe", "ours_us": probe, "ours_gbs": x.numel() * 4 / probe / 1e3, "of_ceiling": 1.0}]
    for name, (ours, _) in OPS.items():
        data = input_for(name, (2**28,), torch.float32)
        t = timer.median_us(lambda: ours(data, None), 20)
        gbs = data.numel() * data.element_size() / t / 1e3
        rows.append({"op": name, "ours_us": t, "ours_gbs": gbs, "of_ceiling": probe / t * (
            data.numel() * data.element_size()) / (x.numel() * 4)})
        del data
    return rows


def gpt2_grads():
    d, layers, vocab = 768, 12, 50257
    shapes = [(vocab, d), (1024, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    shapes += [(d,), (d,)]
    params = [torch.nn.Parameter(torch.empty(s, device="cuda")) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device="cuda") * 1e-2
    return params


def loop_us(fn, calls: int = 50, trials: int = 7) -> float:
    """Wall µs a call of back-to-back calls, synchronized at the end: what a
    loop feels, the host's pace or the device's, whichever is slower."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(trials):
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - begin) / calls * 1e6)
    return statistics.median(samples)


def loop_pair_us(ours, theirs, rounds: int = 6) -> tuple[float, float]:
    """loop_us of both, taken in turns (each first every other round), so that
    the host's drift reaches both alike: medians."""
    samples = ([], [])
    for r in range(rounds):
        for i in ((0, 1), (1, 0))[r % 2]:
            samples[i].append(loop_us((ours, theirs)[i], trials=3))
    return statistics.median(samples[0]), statistics.median(samples[1])


def clip_rows(timer):
    """Device µs (each call queued behind a sleep that outlasts the host's
    work for 148 tensors, L2 evicted) and µs a call of back-to-back calls."""
    params = gpt2_grads()
    grads = [p.grad for p in params]
    saved = [g.clone() for g in grads]
    total_bytes = sum(g.numel() * 4 for g in grads)

    def restore():
        torch._foreach_copy_(grads, saved)

    def device_us(fn):
        return timer.median_us(fn, 30, behind_sleep=SLEEP_CYCLES)

    # max_norm below the total norm, so both scale every gradient; the copy
    # that resets the gradients before each clip is subtracted (passes: the
    # gradients' bytes each call moves).
    cases = [(f"foreach_norm, {len(grads)} GPT-2 gradients", 1, None,
              lambda: fr.foreach_norm(grads), lambda: torch._foreach_norm(grads)),
             ("clip_grad_norm_ (minus the copy that resets the grads)", 3, restore,
              lambda: (restore(), fr.clip_grad_norm_(params, 0.1)),
              lambda: (restore(), torch.nn.utils.clip_grad_norm_(params, 0.1)))]
    rows = []
    for case, passes, before, ours, theirs in cases:
        minus_device, minus_loop = (device_us(before), loop_us(before)) if before else (0.0, 0.0)
        ours_us, torch_us = device_us(ours) - minus_device, device_us(theirs) - minus_device
        ours_call, torch_call = (t - minus_loop for t in loop_pair_us(ours, theirs))
        rows.append({"case": case, "ours_us": ours_us, "torch_us": torch_us,
                     "ours_gbs": passes * total_bytes / ours_us / 1e3, "ratio": torch_us / ours_us,
                     "ours_call_us": ours_call, "torch_call_us": torch_call, "call_ratio": torch_call / ours_call})
    restore()
    ours_total = fr.clip_grad_norm_(params, 0.1)
    ours_grads = [g.clone() for g in grads]
    restore()
    torch_total = torch.nn.utils.clip_grad_norm_(params, 0.1)
    same = all(torch.allclose(a, b, rtol=1e-5, atol=0) for a, b in zip(ours_grads, grads))
    return rows, {"total_norm_ours": ours_total.item(), "total_norm_torch": torch_total.item(), "grads_equal": same}


def main():
    env = environment()
    timer = Timer()
    ops = op_rows(timer)
    ceiling = ceiling_rows(timer)
    clip, agreement = clip_rows(timer)
    print(header(env))
    text = print_table(
        "The reduction family (µs, median, L2 evicted; GB/s counts input + outputs)",
        ["op", "dtype", "shape", "dim", "torch", "torch.compile", "fastreduce", "GB/s", "vs torch", "vs compile"],
        [[r["op"], r["dtype"], tuple(r["shape"]), r["dim"], r["torch_us"], r["compile_us"], r["ours_us"],
          r["ours_gbs"], r["ratio"], r["compile_ratio"]] for r in ops],
    )
    text += print_table(
        "Full reductions of 2^28 float32 against the read probe",
        ["op", "fastreduce µs", "GB/s", "of read ceiling"],
        [[r["op"], r["ours_us"], r["ours_gbs"], r["of_ceiling"]] for r in ceiling],
    )
    text += print_table(
        f"Gradient norms, GPT-2 124M float32 (µs: the device's, L2 evicted; a call: back-to-back calls; "
        f"total norm: ours {agreement['total_norm_ours']:.6f}, "
        f"torch {agreement['total_norm_torch']:.6f}; clipped grads equal: {agreement['grads_equal']})",
        ["case", "torch µs", "fastreduce µs", "GB/s", "speed-up", "torch µs a call", "fastreduce µs a call",
         "speed-up a call"],
        [[r["case"], r["torch_us"], r["ours_us"], r["ours_gbs"], r["ratio"], r["torch_call_us"], r["ours_call_us"],
          r["call_ratio"]] for r in clip],
    )
    save_json("statistics.json", {"environment": env, "ops": ops, "ceiling": ceiling, "clip": clip,
                              "agreement": agreement, "markdown": text})


if __name__ == "__main__":
    main()
