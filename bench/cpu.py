"""CPU kernels against aten's at a fixed thread count (2 by default: the CI and
development machines' cores). Median wall time of repeated calls on random
data; each ratio is aten's time / ours from the same run (> 1: faster).

    python bench/cpu.py [--threads 2] [--reps 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import fastreduce_torch as fr
from common import cpu_environment, header, print_table, save_json


def median_ms(fn, reps: int) -> float:
    fn()
    samples = []
    for _ in range(reps):
        begin = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(samples)


def data(shape, dtype):
    if dtype == torch.int32:
        return torch.randint(-100, 100, shape, dtype=dtype)
    return torch.randn(shape).to(dtype)


def causal_reference(s, scale):
    upper = torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool).triu(1)
    return torch.softmax((scale * s).masked_fill(upper, float("-inf")), -1)


def cases():
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        name = str(dtype).replace("torch.", "")
        v = data((1 << 24,), dtype)
        m = data((8192, 768), dtype)
        yield f"sum 2^24 {name}", lambda v=v: fr.sum(v), lambda v=v: torch.sum(v)
        yield f"sum dim 0 (8192, 768) {name}", lambda m=m: fr.sum(m, 0), lambda m=m: torch.sum(m, 0)
        yield f"sum dim 1 (8192, 768) {name}", lambda m=m: fr.sum(m, 1), lambda m=m: torch.sum(m, 1)
        yield f"amax dim 1 (8192, 768) {name}", lambda m=m: fr.amax(m, 1), lambda m=m: torch.amax(m, 1)
        yield f"amin 2^24 {name}", lambda v=v: fr.amin(v), lambda v=v: torch.amin(v)
        if dtype != torch.int32:
            yield f"mean dim 1 (8192, 768) {name}", lambda m=m: fr.mean(m, 1), lambda m=m: torch.mean(m, 1)
            p = (torch.rand(8192, 768) + 0.5).to(dtype)
            yield f"prod dim 1 (8192, 768) {name}", lambda p=p: fr.prod(p, 1), lambda p=p: torch.prod(p, 1)
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        x = data((8192, 768), dtype)
        w, b = data((768,), dtype), data((768,), dtype)
        g = data((8192, 768), dtype)
        y, mean, rstd = torch.ops.fastreduce.layer_norm(x, [768], w, b, 1e-5)
        _, amean, arstd = torch.ops.aten.native_layer_norm(x, [768], w, b, 1e-5)
        yield (f"layer_norm fwd (8192, 768) {name}", lambda: fr.layer_norm(x, 768, w, b),
               lambda: F.layer_norm(x, (768,), w, b))
        yield (f"layer_norm bwd (8192, 768) {name}",
               lambda: torch.ops.fastreduce.layer_norm_backward(g, x, [768], mean, rstd, w, b),
               lambda: torch.ops.aten.native_layer_norm_backward(g, x, [768], amean, arstd, w, b, [True] * 3))
        s = data((8192, 1024), dtype)
        ys = torch.softmax(s, -1)
        gs = data((8192, 1024), dtype)
        yield f"softmax fwd (8192, 1024) {name}", lambda: fr.softmax(s, -1), lambda: torch.softmax(s, -1)
        yield (f"softmax bwd (8192, 1024) {name}", lambda: torch.ops.fastreduce.softmax_backward(gs, ys, -1),
               lambda: torch.ops.aten._softmax_backward_data(gs, ys, -1, ys.dtype))
        c = data((2, 12, 512, 512), dtype)
        yield (f"causal_softmax (2, 12, 512, 512) {name} vs masked softmax", lambda: fr.causal_softmax(c, 0.125),
               lambda: causal_reference(c, 0.125))
        yield (f"rms_norm fwd (8192, 768) {name}", lambda: fr.rms_norm(x, 768, w),
               lambda: F.rms_norm(x, (768,), w))
        r = data((8192, 768), dtype)
        yield (f"add_layer_norm fwd (8192, 768) {name} vs add + layer_norm",
               lambda: fr.add_layer_norm(x, r, 768, w, b), lambda: F.layer_norm(x + r, (768,), w, b))
        logits = data((4096, 8192), dtype)
        target = torch.randint(0, 8192, (4096,))
        yield (f"cross_entropy fwd (4096, 8192) {name}", lambda: fr.cross_entropy(logits, target),
               lambda: F.cross_entropy(logits, target))
    yield from family_cases()


def family_cases():
    """The reduction family (issue 10) over rows and columns of (8192, 768)."""
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        m = data((8192, 768), dtype)
        for dim in (0, 1):
            where = f"dim {dim} (8192, 768) {name}"
            yield f"var_mean {where}", lambda m=m, d=dim: fr.var_mean(m, d), lambda m=m, d=dim: torch.var_mean(m, d)
            yield f"std {where}", lambda m=m, d=dim: fr.std(m, d), lambda m=m, d=dim: torch.std(m, d)
            yield (f"logsumexp {where}", lambda m=m, d=dim: fr.logsumexp(m, d),
                   lambda m=m, d=dim: torch.logsumexp(m, d))
            yield (f"norm {where}", lambda m=m, d=dim: fr.norm(m, 2, d),
                   lambda m=m, d=dim: torch.linalg.vector_norm(m, 2, d))
            yield f"argmax {where}", lambda m=m, d=dim: fr.argmax(m, d), lambda m=m, d=dim: torch.argmax(m, d)
            yield (f"aminmax {where}", lambda m=m, d=dim: fr.aminmax(m, dim=d),
                   lambda m=m, d=dim: torch.aminmax(m, dim=d))
        positive = m > 0
        yield "any dim 1 (8192, 768) bool", lambda: fr.any(positive, 1), lambda: torch.any(positive, 1)
        yield "all dim 0 (8192, 768) bool", lambda: fr.all(positive, 0), lambda: torch.all(positive, 0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for name, ours, theirs in cases():
        a, o = median_ms(theirs, args.reps), median_ms(ours, args.reps)
        rows.append([name, a, o, a / o])
    env = cpu_environment()
    title = f"CPU kernels, {args.threads} threads (ms, median; ratio = aten / ours)"
    markdown = print_table(title, ["case", "aten ms", "ours ms", "ratio"], rows)
    save_json("cpu.json", {"environment": env, "rows": rows, "markdown": markdown})
    print(header(env))


if __name__ == "__main__":
    main()
