#!/usr/bin/env python3
"""Publishes benchmark results: copies the JSONs and plots a bench run wrote
(build/bench-results, or --from DIR) into docs/results, then regenerates the
tables of docs/results.md (and the README's headline table) from them.

Each table sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`
markers; a JSON file that is missing leaves its section as it is.

    python3 scripts/update_readme.py [--from DIR]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
RUN_RESULTS = os.environ.get("FASTREDUCE_RESULTS_DIR") or os.path.join(ROOT, "build", "bench-results")
PAGES = [os.path.join(ROOT, "docs", "results.md"), os.path.join(ROOT, "README.md")]


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
    return "\n".join(lines) + "\n\n" + tail.replace("### ", "#### ") + "\n![ladder](results/ladder.png)\n"


def peer_over_ours(markdown: str) -> str:
    """Tables written before the ratios were turned round (ours/aten columns)
    are shown as aten/ours, so that every ratio reads higher-is-better."""
    lines, flip = [], []
    for line in markdown.split("\n"):
        cells = line.split("|")
        if "ours/aten" in line:
            flip = [i for i, c in enumerate(cells) if "ours/aten" in c]
            line = line.replace("ours/aten", "aten/ours")
        elif line.startswith("|") and flip and not line.startswith("|---"):
            for i in flip:
                cells[i] = f" {1 / float(cells[i]):.2f} "
            line = "|".join(cells)
        elif not line.startswith("|"):
            flip = []
        lines.append(line)
    return "\n".join(lines)


def generic_section(data: dict, image: str | None = None) -> str:
    text = provenance(data["environment"]) + peer_over_ours(data["markdown"]).replace("### ", "#### ")
    return text + (f"\n![plot]({image})\n" if image else "")


SECTIONS = {
    "reduce": lambda d: generic_section(d, "results/reduce.png"),
    "ladder": ladder_section,
    "statistics": generic_section,
    "gpt2_rows": generic_section,
    "llm_rows": generic_section,
    "host": generic_section,
    "cpu": generic_section,
    "linear_cross_entropy": generic_section,
    "peers": generic_section,
    "peers_h100": generic_section,
    "peers_write_flush": generic_section,
    "mixed_precision": generic_section,
}


def publish(source_dir: str) -> None:
    if os.path.abspath(source_dir) == RESULTS:
        return
    for path in glob.glob(os.path.join(source_dir, "*.json")) + glob.glob(os.path.join(source_dir, "*.png")):
        shutil.copy(path, RESULTS)
        print("published", os.path.relpath(os.path.join(RESULTS, os.path.basename(path)), ROOT))


def render_page(path: str) -> None:
    with open(path) as f:
        page = f.read()
    for name, render in SECTIONS.items():
        source = os.path.join(RESULTS, f"{name}.json")
        if not os.path.exists(source) or f"<!-- results:{name} -->" not in page:
            continue
        with open(source) as f:
            body = render(json.load(f))
        pattern = re.compile(rf"(<!-- results:{name} -->\n).*?(<!-- /results:{name} -->)", re.S)
        page = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), page)
    with open(path, "w") as f:
        f.write(page)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", default=RUN_RESULTS, help="where the bench run wrote its JSONs")
    args = parser.parse_args()
    if os.path.isdir(args.source):
        publish(args.source)
    for page in PAGES:
        render_page(page)


if __name__ == "__main__":
    main()
