"""layer_norm, softmax and causal_softmax against torch.nn.functional eager and
torch.compile, forward and backward, at GPT-2 shapes.

Bandwidth counts the bytes that must move: layer_norm forward reads x, w, b
and writes y (mean/rstd are negligible); backward reads dy, x, w and writes
dx, dw, db; softmax reads x and writes y; the causal softmax reads the lower
triangle and writes the whole output; backward reads y, dy, writes dx.
Ratio = reference time / our time (above 1: we are faster).

The layer_norm backward rows time the backward operators alone
(fastreduce.layer_norm_backward against aten.native_layer_norm_backward and
its torch.compile), because issuing a backward through torch.autograd.grad
from Python takes the host about as long as the GPU work and made those
timings swing between runs (44 and 126 µs for the same kernels). The causal
softmax backward rows go through autograd: the eager reference there is the
masked_fill + softmax graph. Every call is timed after a 1 GiB eviction read,
which also gives the host a ~350 µs head start.
"""

from __future__ import annotations

import itertools
import os
import sys

import torch
import torch._functorch.config
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastreduce_torch as fr  # noqa: E402
from common import Timer, environment, header, print_table, progress, save_json  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LAYER_NORM_SHAPES = [(8192, 768), (8192, 1600), (16384, 4096), (32768, 1024)]
SOFTMAX_SHAPES = [(98304, 1024), (98304, 2048)]
CAUSAL_SHAPES = [(8, 12, 1024, 1024), (4, 12, 2048, 2048)]
MASK = [True, True, True]  # native_layer_norm_backward: dx, dweight and dbias


def masked_softmax(scores, scale):
    t = scores.shape[-1]
    upper = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)
    return torch.softmax((scale * scores).masked_fill(upper, float("-inf")), -1)


def layer_norm_cases():
    compiled_fwd = torch.compile(F.layer_norm)
    compiled_bwd = torch.compile(lambda *args: torch.ops.aten.native_layer_norm_backward(*args))
    for (rows, n), (name, dtype) in [(s, d) for s in LAYER_NORM_SHAPES for d in DTYPES.items()]:
        x = torch.randn(rows, n, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        g = torch.randn(rows, n, device="cuda", dtype=dtype)
        size = x.element_size()
        forward_bytes = (2 * rows * n + 2 * n) * size
        yield (f"layer_norm fwd {rows}x{n}", name, forward_bytes,
               lambda: fr.layer_norm(x, n, w, b), lambda: F.layer_norm(x, [n], w, b),
               lambda: compiled_fwd(x, [n], w, b))
        # The backward ops themselves, on the statistics each forward saved.
        xd, wd, bd = x.detach(), w.detach(), b.detach()
        _, mean, rstd = torch.ops.fastreduce.layer_norm(xd, [n], wd, bd, 1e-5)
        _, ref_mean, ref_rstd = torch.ops.aten.native_layer_norm(xd, [n], wd, bd, 1e-5)
        yield (f"layer_norm bwd {rows}x{n}", name, (3 * rows * n + 3 * n) * size,
               lambda: torch.ops.fastreduce.layer_norm_backward(g, xd, [n], mean, rstd, wd, bd),
               lambda: torch.ops.aten.native_layer_norm_backward(g, xd, [n], ref_mean, ref_rstd, wd, bd, MASK),
               lambda: compiled_bwd(g, xd, [n], ref_mean, ref_rstd, wd, bd, MASK))


def softmax_cases():
    compiled_softmax = torch.compile(lambda t: torch.softmax(t, -1))
    compiled_masked = torch.compile(masked_softmax)
    for (rows, n), (name, dtype) in [(s, d) for s in SOFTMAX_SHAPES for d in DTYPES.items()]:
        x = torch.randn(rows, n, device="cuda", dtype=dtype)
        yield (f"softmax {rows}x{n}", name, 2 * x.numel() * x.element_size(),
               lambda: fr.softmax(x), lambda: torch.softmax(x, -1), lambda: compiled_softmax(x))
    for shape, (name, dtype) in [(s, d) for s in CAUSAL_SHAPES for d in DTYPES.items()]:
        scores = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
        scale = shape[-1] ** -0.5
        size = scores.element_size()
        t = shape[-1]
        lower = scores.numel() // (t * t) * t * (t + 1) // 2
        yield (f"causal_softmax fwd {'x'.join(map(str, shape))}", name, (lower + scores.numel()) * size,
               lambda: fr.causal_softmax(scores, scale), lambda: masked_softmax(scores, scale),
               lambda: compiled_masked(scores, scale))
        g = torch.randn(shape, device="cuda", dtype=dtype)
        ours_y, torch_y, comp_y = fr.causal_softmax(scores, scale), masked_softmax(scores, scale), compiled_masked(
            scores, scale)
        yield (f"causal_softmax bwd {'x'.join(map(str, shape))}", name, 3 * scores.numel() * size,
               lambda: torch.autograd.grad(ours_y, scores, g, retain_graph=True),
               lambda: torch.autograd.grad(torch_y, scores, g, retain_graph=True),
               lambda: torch.autograd.grad(comp_y, scores, g, retain_graph=True))


def main():
    # The backward timings replay one graph (retain_graph=True), which compiled
    # backwards refuse while they donate buffers.
    torch._functorch.config.donated_buffer = False
    env = environment()
    # 1 GiB of eviction (~350 µs): issuing an autograd backward from Python
    # takes longer than the default's 90 µs, which would time the host.
    timer = Timer(flush_mb=1024)
    rows = []
    total = 2 * len(DTYPES) * len(LAYER_NORM_SHAPES) + len(DTYPES) * (len(SOFTMAX_SHAPES) + 2 * len(CAUSAL_SHAPES))
    cases = itertools.chain(layer_norm_cases(), softmax_cases())
    for label, dtype, nbytes, ours, eager, compiled in progress(cases, "gpt2_rows", total):
        t_ours = timer.median_us(ours, 30)
        t_eager = timer.median_us(eager, 30)
        t_compiled = timer.median_us(compiled, 30)
        rows.append({"case": label, "dtype": dtype, "ours_us": t_ours, "eager_us": t_eager,
                     "compiled_us": t_compiled, "ours_gbs": nbytes / t_ours / 1e3,
                     "vs_eager": t_eager / t_ours, "vs_compiled": t_compiled / t_ours})
        torch.cuda.empty_cache()
    print(header(env))
    text = print_table(
        "Normalisations (µs, median; eager = torch.nn.functional, causal eager = masked_fill + softmax)",
        ["case", "dtype", "fastreduce", "GB/s", "eager", "torch.compile", "vs eager", "vs compile"],
        [[r["case"], r["dtype"], r["ours_us"], r["ours_gbs"], r["eager_us"], r["compiled_us"], r["vs_eager"],
          r["vs_compiled"]] for r in rows],
    )
    save_json("gpt2_rows.json", {"environment": env, "rows": rows, "markdown": text})


if __name__ == "__main__":
    main()
