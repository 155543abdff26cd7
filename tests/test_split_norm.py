"""The two halves of a norm over rows split across ranks (_row_moments,
_normalize_rows; distributed.py's tensor-parallel norms), against float64
references: every dtype, odd widths, strided and offset inputs, every
optional argument."""

import itertools

import pytest
import torch

from conftest import DEVICES, offset_view

ops = torch.ops.fastreduce
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# 1, 31, 33: element-wise; 64, 4096: 16-byte packs; 2^20 + 3 one long row.
WIDTHS = [1, 31, 33, 64, 4096]
TOLERANCE = {torch.float32: 2e-6, torch.float64: 1e-13, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def sample(rows, n, dtype, device, layout):
    """Data far from zero (mean 50, spread 3): a sum of squares would cancel."""
    x = (torch.randn(rows, n, dtype=torch.float64) * 3 + 50).to(dtype).to(device)
    if layout == "transposed":
        return x.t().contiguous().t()
    if layout == "offset":
        return offset_view(x, 1)
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset"])
def test_row_moments(device, dtype, layout):
    for n in WIDTHS + ([2**20 + 3] if layout == "contiguous" else []):
        rows = 3 if n > 4096 else 7
        x = sample(rows, n, dtype, device, layout)
        mean, var = ops._row_moments(x)
        assert mean.dtype == var.dtype == acc_dtype(dtype) and mean.shape == (rows,)
        reference = x.double()
        want_mean, want_var = reference.mean(-1), reference.var(-1, correction=0)
        # float32 accumulation: relative to the spread (the mean is relative to itself).
        bound = 1e-13 if dtype == torch.float64 else 2e-5
        assert (mean.double() - want_mean).abs().max().item() <= bound * 50, n
        assert ((var.double() - want_var).abs() / want_var.clamp_min(1e-3)).max().item() <= bound * 10, n


@pytest.mark.parametrize("device", DEVICES)
def test_row_moments_shapes(device):
    x = torch.randn(2, 3, 5, device=device)
    mean, var = ops._row_moments(x)
    assert mean.shape == var.shape == (2, 3)
    torch.testing.assert_close(mean, x.mean(-1))
    assert torch.isnan(ops._row_moments(torch.randn(4, 0, device=device))[0]).all()
    assert ops._row_moments(torch.randn(0, 4, device=device))[1].shape == (0,)
    with pytest.raises(RuntimeError, match="'input'"):
        ops._row_moments(torch.ones(3, dtype=torch.int32, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset"])
def test_normalize_rows(device, dtype, layout):
    params = [dtype, torch.float32] if dtype in (torch.float16, torch.bfloat16) else [dtype]
    for n, param_dtype, centered, with_weight, with_bias in itertools.product(
            WIDTHS, params, [True, False], [True, False], [True, False]):
        x = sample(5, n, dtype, device, layout)
        reference = x.double()
        mean = reference.mean(-1)
        rstd = torch.rsqrt(reference.var(-1, correction=0) + 1e-5)
        weight = torch.randn(n, dtype=torch.float64).to(param_dtype).to(device) if with_weight else None
        bias = torch.randn(n, dtype=torch.float64).to(param_dtype).to(device) if with_bias else None
        acc = acc_dtype(dtype)
        y = ops._normalize_rows(x, mean.to(acc) if centered else None, rstd.to(acc), weight, bias)
        assert y.dtype == dtype and y.shape == x.shape
        want = (reference - mean[:, None]) if centered else reference
        want = want * rstd[:, None]
        # Parameters as they are (float32 beside half input: one rounding, of y).
        if weight is not None:
            want = want * weight.double()
        if bias is not None:
            want = want + bias.double()
        err = (y.double() - want).abs().max().item()
        assert err <= TOLERANCE[dtype] * max(1.0, want.abs().max().item()), (n, centered, with_weight, with_bias, err)


@pytest.mark.parametrize("device", DEVICES)
def test_normalize_rows_errors(device):
    x = torch.randn(3, 8, device=device)
    stats = torch.ones(3, device=device)
    with pytest.raises(RuntimeError, match="'rstd' has dtype"):
        ops._normalize_rows(x, stats, stats.double())
    with pytest.raises(RuntimeError, match="'mean' has shape"):
        ops._normalize_rows(x, torch.ones(4, device=device), stats)
    with pytest.raises(RuntimeError, match="'weight' has shape"):
        ops._normalize_rows(x, stats, stats, torch.ones(7, device=device))
    with pytest.raises(RuntimeError, match="'bias' has dtype"):
        ops._normalize_rows(x.half(), stats, stats, None, torch.ones(8, dtype=torch.float64, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(4, 24, device=device)
    mean, var = ops._row_moments(x)
    torch.library.opcheck(ops._row_moments, (x,))
    torch.library.opcheck(ops._normalize_rows, (x, mean, torch.rsqrt(var + 1e-5), torch.randn(24, device=device),
                                                torch.randn(24, device=device)))
    torch.library.opcheck(ops._normalize_rows, (x, None, var, None, None))
