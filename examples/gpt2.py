"""A small GPT-2 written with torch modules, run as is and with fastreduce
swapped in (patch() for the layer norms, causal_softmax for the attention):
same logits within tolerance, then for float32, bfloat16 autocast and
float16 autocast with a GradScaler: a training step with each (loss and
gradients compared) and the time per AdamW step at several (batch, T).
GPT-2 small on a GPU (12 layers, width 768, vocabulary 50257); on the CPU a
2-layer, width-128 model that finishes in well under a minute. Random weights
and tokens; nothing is downloaded.

    python examples/gpt2.py [--device cuda] [--layers 12] [--shapes 1x1024,8x1024,1x128] [--steps 40]
"""

from __future__ import annotations

import argparse
import copy
import statistics
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
    def __init__(self, vocab=50257, context=1024, width=768, heads=12, layers=12):
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


PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


def train_step(model, tokens, optimizer, precision="float32", scaler=None):
    optimizer.zero_grad(set_to_none=True)
    dtype = PRECISIONS[precision]
    with torch.autocast(tokens.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return loss.item()


def make_scaler(precision, device):
    return torch.amp.GradScaler(device) if precision == "float16" else None


def step_times(models, tokens, precision, steps=40):
    """ms per step of each model: the median of `steps` timed steps, the
    models taking turns step by step (ABBA...), so that a slow spell of the
    machine (the host-bound shapes swing by a quarter between runs) falls on
    both alike. Copies train, so the models still share their weights
    afterwards. Each step ends in loss.item(), a full synchronisation."""
    runs = []
    for model in map(copy.deepcopy, models):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        scaler = make_scaler(precision, tokens.device.type)
        for _ in range(2):  # warm-up
            train_step(model, tokens, optimizer, precision, scaler)
        runs.append((model, optimizer, scaler, []))
    for step in range(steps):
        for model, optimizer, scaler, times in runs if step % 2 == 0 else runs[::-1]:
            start = time.perf_counter()
            train_step(model, tokens, optimizer, precision, scaler)
            times.append((time.perf_counter() - start) * 1e3)
    return [statistics.median(times) for *_, times in runs]


def compare_one_step(reference, ours, tokens, precision):
    """One step from the same weights: the losses and every parameter
    gradient (relative to the gradient's own largest entry) side by side."""
    losses, grads = [], []
    for model in (reference, ours):
        model.zero_grad(set_to_none=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        losses.append(train_step(model, tokens, optimizer, precision, make_scaler(precision, tokens.device.type)))
        grads.append([p.grad.float() for p in model.parameters()])
    worst = max(((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item() for a, b in zip(*grads))
    return losses, worst


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    gpu = parser.parse_known_args()[0].device != "cpu"
    parser.add_argument("--layers", type=int, default=12 if gpu else 2)
    parser.add_argument("--width", type=int, default=768 if gpu else 128)
    parser.add_argument("--heads", type=int, default=12 if gpu else 4)
    parser.add_argument("--vocab", type=int, default=50257 if gpu else 4096)
    parser.add_argument("--shapes", default="1x1024,8x1024,1x128" if gpu else "2x64", help="batch x T per timed step")
    parser.add_argument("--precisions", default="float32,bfloat16,float16")
    parser.add_argument("--steps", type=int, default=40 if gpu else 4,
                        help="timed steps per model, the models taking turns")
    args = parser.parse_args()
    torch.manual_seed(0)
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    context = max(t for _, t in shapes)

    reference = GPT2(args.vocab, context, args.width, args.heads, args.layers).to(args.device)
    ours = copy.deepcopy(reference)
    print(f"patched {use_fastreduce(ours)} LayerNorms and {args.layers} attention softmaxes")
    tokens = torch.randint(0, args.vocab, (2, min(context, 256)), device=args.device)
    with torch.no_grad():
        difference = (reference(tokens) - ours(tokens)).abs().max().item()
    print(f"max |logits difference| = {difference:.2e}")
    assert difference < 1e-3, "fastreduce changed the model's output"

    tolerance = {"float32": (1e-4, 1e-3), "bfloat16": (2e-2, 1e-1), "float16": (5e-3, 5e-2)}
    print("| precision | loss torch | loss fastreduce | worst grad difference | "
          + " | ".join(f"step ms {b}x{t}: torch / ours (ratio)" for b, t in shapes) + " |")
    print("|---" * (4 + len(shapes)) + "|")
    for precision in args.precisions.split(","):
        (loss_ref, loss_ours), worst = compare_one_step(reference, ours, tokens, precision)
        loss_tol, grad_tol = tolerance[precision]
        assert abs(loss_ref - loss_ours) <= loss_tol * abs(loss_ref), (precision, loss_ref, loss_ours)
        assert worst <= grad_tol, (precision, worst)
        cells = []
        for batch, t in shapes:
            timed = torch.randint(0, args.vocab, (batch, t + 1), device=args.device)
            t_ref, t_ours = step_times((reference, ours), timed, precision, args.steps)
            cells.append(f"{t_ref:.2f} / {t_ours:.2f} ({t_ref / t_ours:.2f}x)")
        print(f"| {precision} | {loss_ref:.5f} | {loss_ours:.5f} | {worst:.1e} | " + " | ".join(cells) + " |",
              flush=True)
    print(f"device {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"{args.layers} layers, width {args.width}, vocabulary {args.vocab}, AdamW steps (median of "
          f"{args.steps} steps each, the two models taking turns step by step, after 2 warm-up)")


if __name__ == "__main__":
    main()
