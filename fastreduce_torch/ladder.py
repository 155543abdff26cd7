"""The kernel ladder: every classic reduction technique as a named CUDA kernel.

The table lives in ``csrc/ladder/table.h``; this module reads it through the
compiled library, so the listing, the dispatcher, the tests and the benchmark
never disagree.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from . import _C

LADDER_DTYPES = (torch.float32, torch.bfloat16, torch.int32)


class Rung(NamedTuple):
    name: str
    summary: str
    deterministic: bool


def ladder() -> list[Rung]:
    """Every rung in order, from one global atomic per element to the project's kernel."""
    return [Rung(*row) for row in _C.ladder()]


def variants() -> list[str]:
    """Names accepted by :func:`sum_variant`, in ladder order."""
    return [rung.name for rung in ladder()]


def sum_variant(input: Tensor, variant: str) -> Tensor:
    """Full sum of ``input`` computed by the named ladder kernel (float32, bfloat16
    or int32; int32 sums to int64 as in torch). Non-contiguous inputs are copied
    first. On the CPU every variant runs the CPU sum."""
    return torch.ops.fastreduce.sum_variant.default(input, variant)


@torch.library.register_fake("fastreduce::sum_variant")
def _sum_variant_fake(self, variant):
    torch._check(variant in variants(), lambda: f"sum_variant: unknown variant '{variant}' for argument 'variant'")
    torch._check(self.dtype in LADDER_DTYPES, lambda: f"sum_variant: unsupported dtype {self.dtype} for argument 'self'")
    return self.new_empty((), dtype=torch.int64 if self.dtype == torch.int32 else self.dtype)


@torch.library.register_fake("fastreduce::_read_probe")
def _read_probe_fake(self):
    return self.new_empty((), dtype=torch.int32)
