#!/usr/bin/env python3
"""Regenerates the README's results sections from bench/results/*.json.

Each section sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`
markers; a JSON file that is missing leaves its section as it is.
"""

from __future__ import annotations

import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")


def provenance(env: dict) -> str:
    if "gpu" not in env:
        return f"*{env['cpu']}, {env['threads']} threads, torch {env['torch']}, {env['date']}; `{env['command']}`*\n\n"
    return (f"*{env['gpu']}, driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}, "
            f"{env['date']}; `{env['command']}`*\n\n")


def ladder_section(data: dict) -> str:
    first = data["table1"]
    lines = [provenance(data["environment"]),
             f"Sum of 2^25 float32 (128 MiB). `tensor.sum()`: {first['torch_us']:.1f} µs; read ceiling "
             f"(read-only probe, same run): {first['probe_us']:.1f} µs = {first['probe_gbs']:.0f} GB/s.\n",
             "| # | rung | what it changes | µs | GB/s | % of tensor.sum() | % of read ceiling |",
             "|---|---|---|---|---|---|---|"]
    for i, row in enumerate(first["rows"], 1):
        lines.append(f"| {i} | `{row['variant']}` | {row['summary']} | {row['us']:.1f} | {row['gbs']:.0f} | "
                     f"{row['pct_torch']:.0f}% | {row['pct_ceiling']:.0f}% |")
    sweep = data["markdown"].split("### Table 2", 1)
    tail = "### Table 2" + sweep[1] if len(sweep) > 1 else ""
    return "\n".join(lines) + "\n\n" + tail.replace("### ", "#### ") + "\n![ladder](bench/results/ladder.png)\n"


def generic_section(data: dict, image: str | None = None) -> str:
    text = provenance(data["environment"]) + data["markdown"].replace("### ", "#### ")
    return text + (f"\n![plot]({image})\n" if image else "")


SECTIONS = {
    "reduce": lambda d: generic_section(d, "bench/results/reduce.png"),
    "ladder": ladder_section,
    "family": generic_section,
    "norms": generic_section,
    "rows": generic_section,
    "host": generic_section,
    "cpu": generic_section,
}


def main():
    path = os.path.join(ROOT, "README.md")
    with open(path) as f:
        readme = f.read()
    for name, render in SECTIONS.items():
        source = os.path.join(RESULTS, f"{name}.json")
        if not os.path.exists(source):
            continue
        with open(source) as f:
            body = render(json.load(f))
        pattern = re.compile(rf"(<!-- results:{name} -->\n).*?(<!-- /results:{name} -->)", re.S)
        readme = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), readme)
    with open(path, "w") as f:
        f.write(readme)


if __name__ == "__main__":
    main()
