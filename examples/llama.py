"""A small Llama-style model (RMSNorm, pre-norm residuals, SwiGLU MLP, a
cross-entropy head) trained a few steps twice from the same initial weights:
once with torch's modules and functions, once with fastreduce's fused
residual-add + RMSNorm and fused cross-entropy. Prints both loss curves and
the mean step time.

    python examples/llama.py                  # GPU if there is one; on the CPU a model sized for it
    python examples/llama.py --device cuda --layers 8 --width 1024
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from torch import nn

import fastreduce_torch as fr


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(width), nn.RMSNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        hidden = 8 * width // 3
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, fused: bool):
        super().__init__()
        self.fused = fused
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.final_norm = nn.RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        if not self.fused:
            for block in self.blocks:
                h = h + block.attention(block.attn_norm(h))
                h = h + block.mlp(block.mlp_norm(h))
            logits = self.head(self.final_norm(h))
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        # Each sublayer's output is added to the residual stream and the sum
        # normalised for the next sublayer in one pass.
        width = h.shape[-1]
        norms = [n for block in self.blocks for n in (block.attn_norm, block.mlp_norm)] + [self.final_norm]
        y = fr.rms_norm(h, width, norms[0].weight, norms[0].eps)
        for i, block in enumerate(self.blocks):
            y, h = fr.add_rms_norm(block.attention(y), h, width, norms[2 * i + 1].weight, norms[2 * i + 1].eps)
            y, h = fr.add_rms_norm(block.mlp(y), h, width, norms[2 * i + 2].weight, norms[2 * i + 2].eps)
        return fr.cross_entropy(self.head(y).flatten(0, 1), targets.flatten())


def train(model: Llama, batches, device: str, precision: torch.dtype | None) -> tuple[list[float], float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    losses, times = [], []
    for tokens, targets in batches:
        if device == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        with torch.autocast(device, dtype=precision, enabled=precision is not None):
            loss = model(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
        losses.append(loss.item())
    steady = times[1:] or times  # the first step warms up
    return losses, 1e3 * sum(steady) / len(steady)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    gpu = parser.parse_known_args(argv)[0].device != "cpu"
    parser.add_argument("--vocab", type=int, default=32000 if gpu else 4096)
    parser.add_argument("--width", type=int, default=512 if gpu else 128)
    parser.add_argument("--layers", type=int, default=4 if gpu else 2)
    parser.add_argument("--heads", type=int, default=8 if gpu else 4)
    parser.add_argument("--batch", type=int, default=8 if gpu else 2)
    parser.add_argument("--seq", type=int, default=512 if gpu else 64)
    parser.add_argument("--steps", type=int, default=10 if gpu else 5)
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="bfloat16")
    args = parser.parse_args(argv)
    precision = None if args.precision == "float32" else torch.bfloat16
    torch.manual_seed(0)
    reference = Llama(args.vocab, args.width, args.layers, args.heads, fused=False).to(args.device)
    ours = copy.deepcopy(reference)
    ours.fused = True
    batches = [
        (torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device),
         torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device))
        for _ in range(args.steps)
    ]
    torch_losses, torch_ms = train(reference, batches, args.device, precision)
    ours_losses, ours_ms = train(ours, batches, args.device, precision)
    print(f"Llama-style, {args.layers} layers, width {args.width}, vocab {args.vocab}, "
          f"batch {args.batch}x{args.seq}, {args.precision}, {args.device}")
    print("step  torch loss  fastreduce loss")
    for step, (a, b) in enumerate(zip(torch_losses, ours_losses)):
        print(f"{step:4d}  {a:10.5f}  {b:15.5f}")
    print(f"step time (ms, mean after the first): torch {torch_ms:.2f}, fastreduce {ours_ms:.2f} "
          f"({torch_ms / ours_ms:.2f}x)")
    return {"torch_losses": torch_losses, "ours_losses": ours_losses, "torch_ms": torch_ms, "ours_ms": ours_ms}


if __name__ == "__main__":
    main()
