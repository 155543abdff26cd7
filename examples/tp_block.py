"""A Llama-style MLP block trained with tensor and sequence parallelism
(torch.distributed.tensor.parallel) on fastreduce's RMSNorm and
cross-entropy, checked against the same model in one process.

    torchrun --nproc-per-node 2 examples/tp_block.py       # NCCL on GPUs, gloo on CPUs

Sequence parallel: the norms see activations sharded along the sequence
(fastreduce's row rule runs them locally, no communication); the MLP's
first projections are column-parallel, the last row-parallel.
"""

import copy
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

import fastreduce_torch as fr


class Block(torch.nn.Module):
    def __init__(self, dim: int, hidden: int, vocab: int):
        super().__init__()
        self.norm = fr.nn.RMSNorm(dim)
        self.gate, self.up = torch.nn.Linear(dim, hidden, bias=False), torch.nn.Linear(dim, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)
        self.final_norm = fr.nn.RMSNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, x, target):
        h = self.norm(x)
        x = x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))
        logits = self.head(self.final_norm(x))
        if hasattr(logits, "full_tensor"):  # the loss over the whole batch
            logits = logits.full_tensor()
        return fr.cross_entropy(logits.flatten(0, 1), target.flatten())


def main():
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = "cuda" if backend == "nccl" else "cpu"
    dist.init_process_group(backend)
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Block(64, 256, 100).to(device)
    single = copy.deepcopy(model)
    parallelize_module(model, mesh, {
        "norm": SequenceParallel(),
        "gate": ColwiseParallel(input_layouts=Shard(1)),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "final_norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(1), use_local_output=False),
    })
    steps = []
    for m in (model, single):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.5)
        torch.manual_seed(1)
        losses = []
        for _ in range(5):
            x, target = torch.randn(4, 32, 64, device=device), torch.randint(100, (4, 32), device=device)
            # the parallel model takes the activations split along the sequence
            loss = m(distribute_tensor(x, mesh, [Shard(1)]) if m is model else x, target)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        steps.append(losses)
    if dist.get_rank() == 0:
        for i, (parallel, one) in enumerate(zip(*steps)):
            print(f"step {i}: tensor parallel {parallel:.6f}  one process {one:.6f}")
    worst = max(abs(a - b) for a, b in zip(*steps))
    dist.destroy_process_group()
    assert worst < 1e-4, f"losses differ by {worst}"


if __name__ == "__main__":
    main()
