"""One training step (forward + backward) of transformers models whose loss
patch() fuses beyond Llama's form: Granite (logits divided by
logits_scaling), Cohere (multiplied by logit_scale, vocabulary 256000), a
Llava vision-language model (Qwen2 text, vocabulary 151936, text-only
tokens), and encoder-decoders, whose own forward computes the cross-entropy
(mT5, vocabulary 250112; BART; Whisper, 448 labels on 30 s of audio
features); two layers of width 1024 (Whisper: two of each), bf16, batch 4 x
1024, random weights and tokens. Plain transformers against the same model after fastreduce_torch.patch:
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
    """(name, model, its inputs but the labels, the labels' shape)"""
    ids = torch.randint(0, 30000, (4, 1024), device="cuda")
    yield "Granite", transformers.GraniteForCausalLM(
        transformers.GraniteConfig(vocab_size=49155, logits_scaling=8.0, **LAYERS)), dict(input_ids=ids), ids.shape
    yield "Cohere", transformers.CohereForCausalLM(
        transformers.CohereConfig(vocab_size=256000, logit_scale=0.0625, **LAYERS)), dict(input_ids=ids), ids.shape
    text = transformers.Qwen2Config(vocab_size=151936, **LAYERS)
    yield "Llava (Qwen2 text)", transformers.LlavaForConditionalGeneration(
        transformers.LlavaConfig(text_config=text, image_token_id=151646)), dict(input_ids=ids), ids.shape
    yield "mT5", transformers.MT5ForConditionalGeneration(transformers.MT5Config(
        vocab_size=250112, d_model=1024, d_ff=2816, d_kv=128, num_layers=2, num_heads=8,
        decoder_start_token_id=0)), dict(input_ids=ids), ids.shape
    yield "BART", transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=50265, d_model=1024, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=2816,
        decoder_ffn_dim=2816, max_position_embeddings=1024)), dict(input_ids=ids), ids.shape
    yield "Whisper", transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=51865, d_model=1024, encoder_layers=2, decoder_layers=2, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=2816,
        decoder_ffn_dim=2816)), dict(input_features=torch.randn(4, 80, 3000, device="cuda")), (4, 448)


def step(model, inputs, labels, steps=6):
    """Median time of the steps after two warm-ups, the largest peak, the last loss."""
    times, peaks = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        loss = model(**inputs, labels=labels).loss
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
    rows = []
    for name, base, inputs, shape in models(transformers):
        base = base.to("cuda", torch.bfloat16)
        inputs = {k: v.to(base.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
        vocab = base.get_output_embeddings().weight.shape[0]
        labels = torch.randint(0, 30000, shape, device="cuda")
        plain = step(base, inputs, labels)
        patched = copy.deepcopy(base)
        fr.patch(patched)
        fused = step(patched, inputs, labels)
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
