"""One training step (forward + backward) of transformers models whose loss
patch() fuses beyond Llama's form: Granite (logits divided by
logits_scaling), Cohere (multiplied by logit_scale, vocabulary 256000) and a
Llava vision-language model (Qwen2 text, vocabulary 151936, text-only
tokens), two layers of width 1024, bf16, batch 4 x 1024, random weights and
tokens. Plain transformers against the same model after fastreduce_torch.patch:
peak memory over the weights, time a step, and the loss.

    python3 bench/hf_models.py
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, header, print_table, save_json  # noqa: E402

import fastreduce_torch as fr  # noqa: E402

LAYERS = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=8)


def models(transformers):
    yield "Granite", transformers.GraniteForCausalLM(
        transformers.GraniteConfig(vocab_size=49155, logits_scaling=8.0, **LAYERS))
    yield "Cohere", transformers.CohereForCausalLM(
        transformers.CohereConfig(vocab_size=256000, logit_scale=0.0625, **LAYERS))
    text = transformers.Qwen2Config(vocab_size=151936, **LAYERS)
    yield "Llava (Qwen2 text)", transformers.LlavaForConditionalGeneration(
        transformers.LlavaConfig(text_config=text, image_token_id=151646))


def step(model, ids, steps=6):
    """Median time of the steps after two warm-ups, the largest peak, the last loss."""
    times, peaks = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        peaks.append(torch.cuda.max_memory_allocated() - before)
        model.zero_grad(set_to_none=True)
    return statistics.median(times[2:]), max(peaks[2:]), loss.item()


def main():
    import transformers

    transformers.logging.set_verbosity_error()
    env = dict(environment(), transformers=transformers.__version__)
    ids = torch.randint(0, 30000, (4, 1024), device="cuda")
    rows = []
    for name, base in models(transformers):
        base = base.to("cuda", torch.bfloat16)
        vocab = base.get_output_embeddings().weight.shape[0]
        plain = step(base, ids)
        patched = copy.deepcopy(base)
        fr.patch(patched)
        fused = step(patched, ids)
        rows.append([name, vocab, plain[1] / 2**20, fused[1] / 2**20, plain[0] * 1e3, fused[0] * 1e3,
                     plain[0] / fused[0], f"{plain[2]:.4f} / {fused[2]:.4f}"])
        del base, patched
        torch.cuda.empty_cache()
    table = print_table(header(env) + f", transformers {env['transformers']}",
                        ["model", "vocab", "peak MiB", "patched peak MiB", "ms / step", "patched ms / step",
                         "speed-up", "loss (plain / patched)"], rows)
    save_json("hf_models.json", {"environment": env, "rows": rows, "markdown": table})


if __name__ == "__main__":
    main()
