"""The kernel ladder: listing and dispatch everywhere, every rung on CUDA."""

import pytest
import torch

import fastreduce_torch as fr
from conftest import DEVICES, offset_view, random_tensor, requires_cuda

LENGTHS = [1, 7, 1000, 2**20 + 1, 2**25]


def test_listing():
    names = fr.variants()
    assert len(names) >= 18 and len(set(names)) == len(names)
    assert names[-1] == "fastreduce"
    for required in ["atomic_global", "sequential", "warp_shuffle", "cooperative_groups",
                     "cub_block_reduce", "cub_device_reduce", "recursive_multipass"]:
        assert required in names
    assert all(rung.summary for rung in fr.ladder())
    assert not fr.ladder()[0].deterministic and fr.ladder()[-1].deterministic


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    x = random_tensor(10, torch.float32, device)
    with pytest.raises(RuntimeError, match="unknown variant 'nope' for argument 'variant'"):
        fr.sum_variant(x, "nope")
    with pytest.raises(RuntimeError, match="unsupported dtype .* for argument 'self'"):
        fr.sum_variant(x.double(), "sequential")


def test_cpu_dispatch_sums():
    x = random_tensor((33, 5), torch.int32, "cpu")
    for name in fr.variants():
        assert torch.equal(fr.sum_variant(x, name), x.sum())


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("variant", fr.variants())
@pytest.mark.parametrize("n", LENGTHS)
def test_rung(variant, n):
    rung = {r.name: r for r in fr.ladder()}[variant]
    x = random_tensor(n, torch.float32, "cuda")
    reference = x.double().sum()
    # Atomics add in any order: their error grows with n like any float sum.
    tolerance = 1e-5 * x.double().abs().sum() / (1 if rung.deterministic else 1) + 1e-6
    assert abs(fr.sum_variant(x, variant).double() - reference) <= tolerance
    ints = random_tensor(n, torch.int32, "cuda", -1000, 1000)
    assert torch.equal(fr.sum_variant(ints, variant), ints.sum())
    if n <= 2**20 + 1:
        halves = random_tensor(n, torch.bfloat16, "cuda")
        ours = fr.sum_variant(halves, variant)
        assert ours.dtype == torch.bfloat16
        assert abs(ours.double() - halves.double().sum()) <= 1e-2 * halves.double().abs().sum() / n**0.5 + 0.05 * abs(halves.double().sum()) + 1e-3


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("variant", fr.variants())
def test_rung_strided_and_offset(variant):
    x = random_tensor((300, 77), torch.int32, "cuda")
    assert torch.equal(fr.sum_variant(x.t(), variant), x.sum())
    y = offset_view(random_tensor(2**16 + 5, torch.int32, "cuda"), 3)
    assert torch.equal(fr.sum_variant(y, variant), y.sum())


@requires_cuda
@pytest.mark.cuda
def test_deterministic_rungs_are_bitwise_reproducible():
    x = random_tensor(2**22 + 3, torch.float32, "cuda")
    for rung in fr.ladder():
        if rung.deterministic:
            assert torch.equal(fr.sum_variant(x, rung.name), fr.sum_variant(x, rung.name)), rung.name


@requires_cuda
@pytest.mark.cuda
def test_read_probe_runs():
    x = torch.randn(2**20, device="cuda")
    assert torch.ops.fastreduce._read_probe(x).shape == ()
