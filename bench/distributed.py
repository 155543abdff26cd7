"""fastreduce on DTensors across GPUs (NCCL). Run with
    torchrun --nproc-per-node 2 bench/distributed.py
Two cases, printed by rank 0 as a markdown table:
- layer_norm / rms_norm of an (8192, 8192) bfloat16 activation sharded along
  its hidden dim: fastreduce's tensor-parallel path (row statistics
  all-reduced) against all-gathering the activation, running the local op
  and keeping this rank's slice; forward, and forward + backward.
- the sum of a 2^30-element float32 DTensor sharded along its one dim:
  fastreduce's Partial result, reduced by DTensor, against torch.sum of the
  local shard followed by dist.all_reduce.
Bytes are what one rank sends into the collectives per call (payload).
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import fastreduce_torch as fr


def timed(fn, iters=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    times = torch.tensor(times, device="cuda")
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a collective ends when its slowest rank does
    return times.median().item()


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (world,))
    rows = hidden = 8192
    torch.manual_seed(0)
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    xs = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
    ws = distribute_tensor(w, mesh, [Shard(0)]).requires_grad_()
    bs = distribute_tensor(b, mesh, [Shard(0)]).requires_grad_()
    dy = distribute_tensor(torch.randn_like(x), mesh, [Shard(1)])
    gathered_bytes = x.numel() * x.element_size() * (world - 1) // world  # each rank sends its shard
    lines = [f"#### Sharded hidden dim, {world} GPUs ({torch.cuda.get_device_name()}, torch {torch.__version__}), "
             f"({rows}, {hidden}) bfloat16, µs (median of 20, slowest rank)",
             "| op | pass | fastreduce TP | all-gather + local op | speed-up | bytes sent per rank, TP | all-gather |",
             "|---|---|---|---|---|---|---|"]

    def baseline(op):
        def run(backward):
            full = xs.redistribute(mesh, [Replicate()])
            out = op(full, w_full(), b_full()).redistribute(mesh, [Shard(1)])
            if backward:
                out.backward(dy)
        return run

    def w_full():
        return ws.redistribute(mesh, [Replicate()])

    def b_full():
        return bs.redistribute(mesh, [Replicate()])

    ops = {
        "layer_norm": (lambda t, w_, b_: fr.layer_norm(t, hidden, w_, b_), 8, 8),
        "rms_norm": (lambda t, w_, b_: fr.rms_norm(t, hidden, w_), 4, 4),
    }
    for name, (op, forward_bytes, backward_bytes) in ops.items():
        reference = op(x.float(), w.float(), b.float())
        torch.testing.assert_close(op(xs, ws, bs).full_tensor().float(), reference, atol=0.1, rtol=0.02)
        for backward in (False, True):
            def tp():
                out = op(xs, ws, bs)
                if backward:
                    out.backward(dy)
            fast, slow = timed(tp), timed(lambda: baseline(op)(backward))
            sent = rows * (forward_bytes + (backward_bytes if backward else 0))
            gather = gathered_bytes * (2 if backward else 1)  # backward: reduce-scatter of the gradient
            lines.append(f"| {name} | {'fwd+bwd' if backward else 'fwd'} | {fast:.0f} | {slow:.0f} | "
                         f"{slow / fast:.2f}x | {sent / 2**10:.0f} KiB | {gather / 2**20:.0f} MiB |")

    n = 2**30
    local = torch.randn(n // world, device="cuda")
    big = torch.distributed.tensor.DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    expected = local.double().sum()
    dist.all_reduce(expected)
    got = fr.sum(big).full_tensor()
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1.0)  # |sum| ~ 2^15

    def torch_way():
        s = torch.sum(local)
        dist.all_reduce(s)
        return s

    ours, theirs = timed(lambda: fr.sum(big).full_tensor()), timed(torch_way)
    lines += ["", f"#### Sum of a 2^30-element float32 DTensor, Shard(0) over {world} GPUs, µs",
              "| fastreduce (Partial, reduced by DTensor) | torch.sum + all_reduce | ratio | bytes sent per rank |",
              "|---|---|---|---|",
              f"| {ours:.0f} | {theirs:.0f} | {theirs / ours:.2f}x | 4 (one float32) |"]
    if rank == 0:
        print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
