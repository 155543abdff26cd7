"""rms_norm, the fused residual add + norms and the fused cross-entropy against
torch.nn.functional eager and torch.compile of the same (unfused) code.

Bandwidth counts the bytes that must move. rms_norm forward reads x, w and
writes y; backward reads dy, x, w and writes dx (dw is n elements). The add
+ norm rows time forward and backward together (one autograd call each):
they read x, residual, write out and h, then read dy, dh, h and write dx.
cross_entropy forward reads the logits; forward + backward reads them twice
and writes the gradient. "% copy" is that bandwidth over the device-to-device
copy ceiling of ANCHORS.md (3024 GB/s). Peak memory: the largest
torch.cuda.max_memory_allocated growth over one forward + backward, beyond
the inputs. Every call is timed after a 1 GiB eviction read (~350 µs of host
head start: autograd calls from Python take longer than the default's).
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

COPY_GBS = 3024.0
RMS_SHAPES = [(8192, 4096), (32768, 1024)]
ADD_SHAPES = [(8192, 4096), (32768, 1024)]
CE_SHAPES = [(8192, 50304), (4096, 128256)]
BF16 = torch.bfloat16


def grad_call(fn, inputs, grads):
    return lambda: torch.autograd.grad(fn(), inputs, grads)


def rms_cases():
    compiled = torch.compile(F.rms_norm)
    for rows, n in RMS_SHAPES:
        x = torch.randn(rows, n, device="cuda", dtype=BF16, requires_grad=True)
        w = torch.randn(n, device="cuda", dtype=BF16, requires_grad=True)
        g = torch.randn(rows, n, device="cuda", dtype=BF16)
        size = x.element_size()
        yield (f"rms_norm fwd {rows}x{n}", (2 * rows * n + n) * size,
               lambda: fr.rms_norm(x, n, w), lambda: F.rms_norm(x, [n], w), lambda: compiled(x, [n], w))
        ours_y, eager_y, compiled_y = fr.rms_norm(x, n, w), F.rms_norm(x, [n], w), compiled(x, [n], w)
        yield (f"rms_norm bwd {rows}x{n}", (3 * rows * n + 2 * n) * size,
               lambda: torch.autograd.grad(ours_y, (x, w), g, retain_graph=True),
               lambda: torch.autograd.grad(eager_y, (x, w), g, retain_graph=True),
               lambda: torch.autograd.grad(compiled_y, (x, w), g, retain_graph=True))


def unfused_add_norm(kind):
    if kind == "layer":
        def step(x, r, w, b):
            h = x + r
            return F.layer_norm(h, [h.shape[-1]], w, b), h
    else:
        def step(x, r, w, b):
            h = x + r
            return F.rms_norm(h, [h.shape[-1]], w), h
    return step


def add_norm_cases():
    for kind in ("rms", "layer"):
        eager = unfused_add_norm(kind)
        compiled = torch.compile(eager)
        for rows, n in ADD_SHAPES:
            x = torch.randn(rows, n, device="cuda", dtype=BF16, requires_grad=True)
            r = torch.randn(rows, n, device="cuda", dtype=BF16, requires_grad=True)
            w = torch.randn(n, device="cuda", dtype=BF16, requires_grad=True)
            b = torch.randn(n, device="cuda", dtype=BF16, requires_grad=True) if kind == "layer" else None
            params = (x, r, w) + ((b,) if b is not None else ())
            gy = torch.randn(rows, n, device="cuda", dtype=BF16)
            gh = torch.randn(rows, n, device="cuda", dtype=BF16)
            if kind == "layer":
                ours = lambda: fr.add_layer_norm(x, r, n, w, b)  # noqa: E731
            else:
                ours = lambda: fr.add_rms_norm(x, r, n, w)  # noqa: E731
            size = x.element_size()
            nbytes = (4 * rows * n + 4 * rows * n) * size
            yield (f"add_{kind}_norm fwd+bwd {rows}x{n}", nbytes,
                   grad_call(ours, params, (gy, gh)),
                   grad_call(lambda: eager(x, r, w, b), params, (gy, gh)),
                   grad_call(lambda: compiled(x, r, w, b), params, (gy, gh)))


def cross_entropy_cases():
    compiled = torch.compile(F.cross_entropy)
    for rows, v in CE_SHAPES:
        logits = torch.randn(rows, v, device="cuda", dtype=BF16, requires_grad=True)
        target = torch.randint(0, v, (rows,), device="cuda")
        size = logits.element_size()
        yield (f"cross_entropy fwd {rows}x{v}", rows * v * size,
               lambda: fr.cross_entropy(logits, target), lambda: F.cross_entropy(logits, target),
               lambda: compiled(logits, target))
        yield (f"cross_entropy fwd+bwd {rows}x{v}", 3 * rows * v * size,
               grad_call(lambda: fr.cross_entropy(logits, target), (logits,), None),
               grad_call(lambda: F.cross_entropy(logits, target), (logits,), None),
               grad_call(lambda: compiled(logits, target), (logits,), None))


def peak_extra_mb(fn) -> float:
    fn()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main():
    torch._functorch.config.donated_buffer = False  # backward rows replay one graph
    env = environment()
    timer = Timer(flush_mb=1024)
    # Generators, consumed one case at a time: each case's closures see its
    # own tensors.
    cases = itertools.chain(rms_cases(), add_norm_cases(), cross_entropy_cases())
    total = 2 * len(RMS_SHAPES) + 2 * len(ADD_SHAPES) + 2 * len(CE_SHAPES)
    rows = []
    for label, nbytes, ours, eager, compiled in progress(cases, "llm_rows", total):
        t_ours = timer.median_us(ours, 30)
        t_eager = timer.median_us(eager, 30)
        t_compiled = timer.median_us(compiled, 30)
        row = {"case": label, "dtype": "bfloat16", "ours_us": t_ours, "eager_us": t_eager,
               "compiled_us": t_compiled, "ours_gbs": nbytes / t_ours / 1e3,
               "copy_pct": 100 * nbytes / t_ours / 1e3 / COPY_GBS,
               "vs_eager": t_eager / t_ours, "vs_compiled": t_compiled / t_ours}
        if label.startswith("cross_entropy fwd+bwd"):
            row.update(ours_peak_mb=peak_extra_mb(ours), eager_peak_mb=peak_extra_mb(eager),
                       compiled_peak_mb=peak_extra_mb(compiled))
        rows.append(row)
        torch.cuda.empty_cache()
    print(header(env))
    text = print_table(
        "Transformer rows, bfloat16 (µs, median; eager and torch.compile run the unfused torch code)",
        ["case", "fastreduce", "GB/s", "% copy", "eager", "torch.compile", "vs eager", "vs compile"],
        [[r["case"], r["ours_us"], r["ours_gbs"], r["copy_pct"], r["eager_us"], r["compiled_us"], r["vs_eager"],
          r["vs_compiled"]] for r in rows],
    )
    text += "\n" + print_table(
        "cross_entropy forward + backward: peak extra memory (MiB; one (N, V) bfloat16 buffer is N*V*2 bytes)",
        ["case", "(N, V) buffer", "fastreduce", "eager", "torch.compile"],
        [[r["case"], int(r["case"].split()[-1].split("x")[0]) * int(r["case"].split("x")[-1]) * 2 / 2**20,
          r["ours_peak_mb"], r["eager_peak_mb"], r["compiled_peak_mb"]] for r in rows if "ours_peak_mb" in r],
    )
    save_json("llm_rows.json", {"environment": env, "rows": rows, "markdown": text})


if __name__ == "__main__":
    main()
