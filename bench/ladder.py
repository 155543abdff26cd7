"""The kernel ladder on this GPU: every rung against tensor.sum() and the read
ceiling, at N = 2^25 float32 (table 1) and over N = 2^16..2^25 for float32 and
int32 (table 2), with a plot of GB/s against N.

The read ceiling is a read-only kernel (16-byte loads, four in flight per
thread) timed in the same run on the same data.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastreduce_torch as fr  # noqa: E402
from common import RESULTS_DIR, Timer, environment, header, print_table, progress, save_json  # noqa: E402

DTYPES = {"float32": torch.float32, "int32": torch.int32}


def random_input(n, dtype):
    if dtype.is_floating_point:
        return torch.randn(n, device="cuda", dtype=dtype)
    return torch.randint(-1000, 1000, (n,), device="cuda", dtype=dtype)


def table1(timer):
    x = random_input(2**25, torch.float32)
    nbytes = x.numel() * 4
    t_torch = timer.median_us(lambda: x.sum(), 50)
    t_probe = timer.median_us(lambda: torch.ops.fastreduce._read_probe(x), 50)
    rows = []
    for rung in progress(fr.ladder(), "ladder at 2^25"):
        t = timer.median_us(lambda: fr.sum_variant(x, rung.name), 50)
        rows.append({"variant": rung.name, "summary": rung.summary, "us": t, "gbs": nbytes / t / 1e3,
                     "pct_torch": 100 * t_torch / t, "pct_ceiling": 100 * t_probe / t})
    return {"torch_us": t_torch, "probe_us": t_probe, "probe_gbs": nbytes / t_probe / 1e3, "rows": rows}


def table2(timer):
    rows = []
    for name, dtype in DTYPES.items():
        for log2 in progress(range(16, 26), f"sweep {name}"):
            x = random_input(2**log2, dtype)
            row = {"dtype": name, "log2n": log2, "bytes": x.numel() * x.element_size(),
                   "torch": timer.median_us(lambda: x.sum(), 30)}
            for variant in fr.variants():
                row[variant] = timer.median_us(lambda: fr.sum_variant(x, variant), 30, budget_s=0.5)
            rows.append(row)
    return rows


def plot(sweep, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 6), sharey=True)
    for ax, name in zip(axes, DTYPES):
        sel = [r for r in sweep if r["dtype"] == name]
        n = [2 ** r["log2n"] for r in sel]
        for variant in ["torch"] + fr.variants():
            style = "k--" if variant == "torch" else "-"
            label = "tensor.sum()" if variant == "torch" else variant
            ax.plot(n, [r["bytes"] / r[variant] / 1e3 for r in sel], style, label=label, lw=2 if variant in (
                "torch", "fastreduce") else 1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{name}: sum of N elements")
        ax.set_xlabel("N")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("GB/s (input bytes / time)")
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle("Kernel ladder on " + torch.cuda.get_device_name())
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    env = environment()
    timer = Timer()
    first = table1(timer)
    sweep = table2(timer)
    print(header(env))
    text = print_table(
        f"Table 1: sum of 2^25 float32 (128 MiB); tensor.sum() {first['torch_us']:.1f} µs, "
        f"read ceiling {first['probe_us']:.1f} µs ({first['probe_gbs']:.0f} GB/s)",
        ["variant", "µs", "GB/s", "% of tensor.sum()", "% of read ceiling", "technique"],
        [[r["variant"], r["us"], r["gbs"], r["pct_torch"], r["pct_ceiling"], r["summary"]] for r in first["rows"]],
    )
    for name in DTYPES:
        sel = [r for r in sweep if r["dtype"] == name]
        text += print_table(
            f"Table 2 ({name}): µs per call",
            ["variant"] + [f"2^{r['log2n']}" for r in sel],
            [[v if v != "torch" else "tensor.sum()"] + [r[v] for r in sel] for v in ["torch"] + fr.variants()],
        )
    save_json("ladder.json", {"environment": env, "table1": first, "table2": sweep, "markdown": text})
    plot(sweep, os.path.join(RESULTS_DIR, "ladder.png"))


if __name__ == "__main__":
    main()
