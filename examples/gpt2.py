"""A small GPT-2 written with torch modules, run as is and with fastreduce
swapped in (patch() for the layer norms, causal_softmax for the attention):
same logits within tolerance, a training step with each, and the time per
step. Random weights and tokens; nothing is downloaded.

    python examples/gpt2.py [--device cuda] [--layers 4] [--width 256]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from torch import nn

import fastreduce_torch as fr


def torch_causal_softmax(scores: torch.Tensor, scale: float) -> torch.Tensor:
    t = scores.shape[-1]
    upper = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)
    return torch.softmax((scale * scores).masked_fill(upper, float("-inf")), -1)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.softmax = torch_causal_softmax

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = self.softmax(q @ k.transpose(-1, -2), (c // self.heads) ** -0.5)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab=1024, context=256, width=256, heads=8, layers=4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def use_fastreduce(model: GPT2) -> int:
    """Swaps fastreduce into a model: its layer norms, and the attention softmax."""
    replaced = fr.patch(model)
    for module in model.modules():
        if isinstance(module, CausalSelfAttention):
            module.softmax = fr.causal_softmax
    return replaced


def train_step(model, tokens, optimizer):
    optimizer.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.item()


def time_per_step(model, tokens, steps=10):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_step(model, tokens, optimizer)  # warm-up
    if tokens.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        train_step(model, tokens, optimizer)
    if tokens.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Defaults: GPT-2 small's width, heads and context, 4 layers, batch 4.
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=1024)
    args = parser.parse_args()
    torch.manual_seed(0)

    reference = GPT2(context=args.context, width=args.width, heads=args.heads, layers=args.layers).to(args.device)
    ours = copy.deepcopy(reference)
    print(f"patched {use_fastreduce(ours)} LayerNorms and {args.layers} attention softmaxes")
    tokens = torch.randint(0, 1024, (args.batch, args.context), device=args.device)

    with torch.no_grad():
        expected, got = reference(tokens), ours(tokens)
    difference = (expected - got).abs().max().item()
    print(f"max |logits difference| = {difference:.2e}")
    assert difference < 1e-3, "fastreduce changed the model's output"

    loss_ref = train_step(reference, tokens, torch.optim.SGD(reference.parameters(), lr=1e-2))
    loss_ours = train_step(ours, tokens, torch.optim.SGD(ours.parameters(), lr=1e-2))
    print(f"training step loss: torch {loss_ref:.5f}, fastreduce {loss_ours:.5f}")
    assert abs(loss_ref - loss_ours) < 1e-3
    after = (reference(tokens) - ours(tokens)).abs().max().item()
    print(f"max |logits difference| after one SGD step = {after:.2e}")

    steps = 10 if args.device == "cuda" else 2
    t_ref, t_ours = time_per_step(reference, tokens, steps), time_per_step(ours, tokens, steps)
    print(f"time per training step on {args.device}: torch {t_ref:.2f} ms, fastreduce {t_ours:.2f} ms "
          f"({t_ref / t_ours:.2f}x)")


if __name__ == "__main__":
    main()
