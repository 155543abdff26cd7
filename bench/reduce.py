"""fastreduce_torch.sum against tensor.sum(): full sums over N = 2^10..2^30 for
float32, bfloat16 and int32, and dim reductions of 2-D tensors, each beside
our full sum of the same tensor: the rate one read of those bytes reaches when
timed per call, the ceiling a tall column sum can approach at that size.

Bandwidth counts the bytes that must move: the input once, plus the output
for dim reductions. Ratio = torch time / our time (above 1: we are faster).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastreduce_torch as fr  # noqa: E402
from common import RESULTS_DIR, Timer, environment, header, print_table, progress, save_json  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int32": torch.int32}
DIM_SHAPES = [(8192, 8192), (65536, 768), (65536, 128), (128, 65536)]


def random_input(n_or_shape, dtype):
    if dtype.is_floating_point:
        return torch.randn(n_or_shape, device="cuda").to(dtype)
    return torch.randint(-1000, 1000, n_or_shape if isinstance(n_or_shape, tuple) else (n_or_shape,),
                         device="cuda", dtype=dtype)


def full_sweep(timer, max_log2):
    rows = []
    for name, dtype in DTYPES.items():
        for log2 in progress(range(10, max_log2 + 1), f"full sum {name}"):
            x = random_input(2**log2, dtype)
            reps = 100 if log2 < 26 else 20
            t_torch = timer.median_us(lambda: x.sum(), reps)
            t_ours = timer.median_us(lambda: fr.sum(x), reps)
            gbs = x.numel() * x.element_size() / t_ours / 1e3
            rows.append({"dtype": name, "log2n": log2, "torch_us": t_torch, "ours_us": t_ours,
                         "ours_gbs": gbs, "torch_gbs": x.numel() * x.element_size() / t_torch / 1e3,
                         "ratio": t_torch / t_ours})
            del x
    return rows


def dim_sweep(timer):
    rows = []
    for name in ("float32", "bfloat16"):
        dtype = DTYPES[name]
        for shape in DIM_SHAPES:
            x = random_input(shape, dtype)
            full_gbs = x.numel() * x.element_size() / timer.median_us(lambda: fr.sum(x), 50) / 1e3
            for dim in (0, 1):
                t_torch = timer.median_us(lambda: x.sum(dim), 50)
                t_ours = timer.median_us(lambda: fr.sum(x, dim), 50)
                moved = x.numel() * x.element_size() + x.shape[1 - dim] * x.element_size()
                rows.append({"dtype": name, "shape": list(shape), "dim": dim, "torch_us": t_torch,
                             "ours_us": t_ours, "ours_gbs": moved / t_ours / 1e3,
                             "torch_gbs": moved / t_torch / 1e3, "full_sum_gbs": full_gbs,
                             "ratio": t_torch / t_ours})
    return rows


def plot(full_rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in DTYPES:
        sel = [r for r in full_rows if r["dtype"] == name]
        n = [2 ** r["log2n"] for r in sel]
        ax.plot(n, [r["ours_gbs"] for r in sel], "-o", ms=3, label=f"fastreduce {name}")
        ax.plot(n, [r["torch_gbs"] for r in sel], "--", label=f"tensor.sum() {name}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (elements)")
    ax.set_ylabel("GB/s (input bytes / time)")
    ax.set_title("Full sum on " + torch.cuda.get_device_name())
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-log2", type=int, default=30)
    args = parser.parse_args()
    env = environment()
    timer = Timer()
    full = full_sweep(timer, args.max_log2)
    dims = dim_sweep(timer)
    print(header(env))
    text = print_table(
        "Full sum (µs, median, L2 evicted by a read)",
        ["dtype", "N", "tensor.sum()", "fastreduce", "GB/s", "speed-up"],
        [[r["dtype"], f"2^{r['log2n']}", r["torch_us"], r["ours_us"], r["ours_gbs"], r["ratio"]] for r in full],
    )
    text += print_table(
        "Dim sums (µs; GB/s counts input + output; full sum: our sum of all of the same tensor)",
        ["dtype", "shape", "dim", "tensor.sum(dim)", "fastreduce", "GB/s", "full sum GB/s", "speed-up"],
        [[r["dtype"], tuple(r["shape"]), r["dim"], r["torch_us"], r["ours_us"], r["ours_gbs"], r["full_sum_gbs"],
          r["ratio"]] for r in dims],
    )
    save_json("reduce.json", {"environment": env, "full": full, "dims": dims, "markdown": text})
    plot(full, os.path.join(RESULTS_DIR, "reduce.png"))


if __name__ == "__main__":
    main()
