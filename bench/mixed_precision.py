"""The norms with float32 weight and bias beside bfloat16 rows (mixed
precision: autocast leaves rms_norm so, Gemma's `1 + weight` is float32)
against the same norms with bfloat16 parameters, and torch eager's rms_norm
with the mix (its CUDA layer_norm refuses it). Device time of one call
(common.Timer, the call queued behind a sleep so host work is not timed),
forward and forward + backward, µs.

    python bench/mixed_precision.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fastreduce_torch as fr
from common import SLEEP_CYCLES, Timer, environment, header, print_table, save_json

# Hidden sizes, and head sizes (query/key norms: a row per token and head).
SHAPES = [(262144, 128), (131072, 256), (8192, 768), (32768, 1024), (8192, 1600), (8192, 4096), (4096, 8192),
          (1024, 32768)]
NORMS = ["rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm"]


def call(norm, x, residual, weight, bias, torch_own=False):
    n = x.shape[-1]
    if torch_own:
        return F.rms_norm(x, [n], weight, 1e-6)
    if norm == "rms_norm":
        return fr.rms_norm(x, n, weight, 1e-6)
    if norm == "layer_norm":
        return fr.layer_norm(x, n, weight, bias, 1e-5)
    if norm == "add_rms_norm":
        return fr.add_rms_norm(x, residual, n, weight, 1e-6)[0]
    return fr.add_layer_norm(x, residual, n, weight, bias, 1e-5)[0]


def timings(timer, norm, x, residual, grad, weight, bias, torch_own=False):
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight) + ((bias,) if "layer" in norm else ())]

    def forward_backward():
        out = call(norm, leaves[0], residual, leaves[1], leaves[2] if len(leaves) > 2 else None, torch_own)
        torch.autograd.grad(out, leaves, grad)

    forward = timer.median_us(lambda: call(norm, x, residual, weight, bias, torch_own), behind_sleep=SLEEP_CYCLES)
    return forward, timer.median_us(forward_backward, behind_sleep=SLEEP_CYCLES)


def main():
    env = environment()
    timer = Timer()
    rows, results = [], []
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        residual, grad = torch.randn_like(x), torch.randn_like(x)
        weight, bias = torch.randn(n, device="cuda") * 0.3 + 1, torch.randn(n, device="cuda") * 0.3
        for norm in NORMS:
            same = timings(timer, norm, x, residual, grad, weight.bfloat16(), bias.bfloat16())
            mixed = timings(timer, norm, x, residual, grad, weight, bias)
            torch_mixed = timings(timer, norm, x, None, grad, weight, None, True) if norm == "rms_norm" else None
            row = [norm, f"({m}, {n})", same[0], mixed[0], mixed[0] / same[0], same[1], mixed[1], mixed[1] / same[1]]
            row += [torch_mixed[0], torch_mixed[1]] if torch_mixed else ["", ""]
            rows.append(row)
            results.append({"norm": norm, "shape": [m, n], "bf16_params_us": same, "float32_params_us": mixed,
                            "torch_float32_params_us": torch_mixed})
    print(header(env))
    markdown = print_table("bfloat16 rows, parameters bfloat16 / float32 (device µs per call)",
                           ["norm", "shape", "fwd bf16", "fwd f32", "f32 / bf16", "fwd+bwd bf16", "fwd+bwd f32", "f32 / bf16",
                            "torch fwd f32", "torch fwd+bwd f32"], rows)
    save_json("mixed_precision.json", {"environment": env, "results": results, "markdown": markdown})


if __name__ == "__main__":
    main()
