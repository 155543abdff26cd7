"""A Hugging Face transformers Llama trained a few steps four ways from the
same initial weights and tokens: plain transformers, torch.compile,
Liger-Kernel (when installed: apply_liger_kernel_to_llama) and
fastreduce_torch.patch (its norms and the fused linear cross-entropy loss).
Prints step time, tokens per second, peak memory and the first losses.
Random weights and tokens; nothing is downloaded. Each way runs in its own
process (Liger patches transformers' classes globally).

    python examples/hf_llama.py                 # on a GPU: hidden 2048, 16 layers, vocab 128256, seq 4096, bf16
    python examples/hf_llama.py --impl fastreduce --steps 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time

import torch

# "liger (norms + loss)": Liger replacing only what fastreduce replaces (its
# default patch also swaps the MLP's SwiGLU and the rotary embedding).
IMPLS = ["transformers", "torch.compile", "liger", "liger (norms + loss)", "fastreduce"]


def arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    gpu = parser.parse_known_args(argv)[0].device != "cpu"
    parser.add_argument("--impl", default="all", choices=["all"] + IMPLS)
    parser.add_argument("--hidden", type=int, default=2048 if gpu else 64)
    parser.add_argument("--layers", type=int, default=16 if gpu else 2)
    parser.add_argument("--vocab", type=int, default=128256 if gpu else 1000)
    parser.add_argument("--seq", type=int, default=4096 if gpu else 64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=12 if gpu else 3, help="the first two warm up")
    return parser.parse_args(argv)


def train(args) -> dict:
    import transformers

    if args.impl.startswith("liger"):
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        everything = args.impl == "liger"
        apply_liger_kernel_to_llama(rope=everything, swiglu=everything)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                      intermediate_size=int(2.75 * args.hidden) // 64 * 64,
                                      num_hidden_layers=args.layers, num_attention_heads=max(args.hidden // 128, 1),
                                      num_key_value_heads=max(args.hidden // 256, 1),
                                      max_position_embeddings=args.seq)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = transformers.LlamaForCausalLM(config).to(dtype)
    if args.impl == "fastreduce":
        import fastreduce_torch as fr
        fr.patch(model)
    step_model = torch.compile(model) if args.impl == "torch.compile" else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    losses, times = [], []
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator).to(args.device)
        begin = time.perf_counter()
        loss = step_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
        losses.append(loss.item())
        print(f"  {args.impl}: step {step} loss {losses[-1]:.5f} {1e3 * times[-1]:.1f} ms", file=sys.stderr, flush=True)
    steady = sorted(times[2:] or times)
    step_s = steady[len(steady) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else float("nan")
    return {"impl": args.impl, "ms": 1e3 * step_s, "tokens_per_s": args.batch * args.seq / step_s,
            "peak_gib": peak, "losses": losses}


def main(argv=None):
    args = arguments(argv)
    if args.impl != "all":
        print(json.dumps(train(args)))
        return
    rows = []
    for impl in IMPLS:
        if impl.startswith("liger") and importlib.util.find_spec("liger_kernel") is None:
            print("liger-kernel not installed: left out")
            continue
        command = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--impl", impl]
        result = subprocess.run(command, capture_output=True, text=True)
        sys.stderr.write(result.stderr[-2000:] if result.returncode else "")
        if result.returncode:
            print(f"{impl}: failed (exit {result.returncode})")
            continue
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
    base = next((r for r in rows if r["impl"] == "transformers"), rows[0])
    print(f"Llama, hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, batch {args.batch} x {args.seq}, "
          f"{'bf16' if args.device == 'cuda' else 'float32'}, {args.device}, torch {torch.__version__}, AdamW; "
          f"median of steps 2..{args.steps - 1}")
    print("| impl | ms / step | tokens / s | vs transformers | peak GiB | first losses |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['impl']} | {r['ms']:.1f} | {r['tokens_per_s']:.0f} | {base['ms'] / r['ms']:.2f}x | "
              f"{r['peak_gib']:.2f} | {', '.join(f'{v:.4f}' for v in r['losses'][:3])} |")


if __name__ == "__main__":
    main()
