"""The defects of issue 28, each against torch's own answer: bad input
raises a clear error, unusual input gives torch's values."""

import pytest
import torch
import torch.nn.functional as F

import fastreduce_torch as fr
from conftest import DEVICES, requires_cuda

ops = torch.ops.fastreduce


@requires_cuda
@pytest.mark.cuda
def test_backward_ops_refuse_mixed_devices():
    x = torch.randn(4, 8, device="cuda")
    out, mean, rstd = ops.layer_norm(x, [8])
    with pytest.raises(RuntimeError, match="'rstd' is on cpu"):
        ops.layer_norm_backward(out, x, [8], mean, rstd.cpu(), None, None)
    loss, lse = ops.cross_entropy(x, torch.zeros(4, dtype=torch.long, device="cuda"))
    with pytest.raises(RuntimeError, match="'lse' is on cpu"):
        ops.cross_entropy_backward(torch.ones((), device="cuda"), None, x, torch.zeros(4, dtype=torch.long,
                                   device="cuda"), lse.cpu(), "mean", -100, 0.0)
    result = ops.prod(x, [1])
    with pytest.raises(RuntimeError, match="'result' is on cpu"):
        ops.prod_backward(torch.ones_like(result), x, result.cpu(), [1])
    torch.cuda.synchronize()  # the context is still usable


@pytest.mark.parametrize("device", DEVICES)
def test_foreach_norm_of_an_empty_tensor(device):
    tensors = [torch.zeros(0, device=device), torch.ones(3, device=device)]
    for ours, theirs in zip(fr.foreach_norm(tensors), torch._foreach_norm(tensors)):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("magnitude", [1e4, 1e18])
def test_softmax_of_huge_logits(device, magnitude):
    x = (torch.rand(4, 8, device=device) + 1) * magnitude
    for dim in (0, 1):
        torch.testing.assert_close(fr.softmax(x, dim), torch.softmax(x, dim))
    for n in (3000, 40000):  # the register-row and block kernels
        x = (torch.rand(3, n, device=device) + 1) * magnitude
        torch.testing.assert_close(fr.softmax(x, -1), torch.softmax(x, -1))
    scores = (torch.rand(2, 8, 8, device=device) + 1) * magnitude
    upper = torch.ones(8, 8, dtype=torch.bool, device=device).triu(1)
    for scale in (0.5, 96 ** -0.5):  # a power of two, and one whose product rounds
        expected = torch.softmax((scale * scores).masked_fill(upper, float("-inf")), -1)
        torch.testing.assert_close(fr.causal_softmax(scores, scale), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_with_inf_and_nan_is_nan_like_torch(device):
    for special in (float("inf"), float("nan")):
        x = torch.randn(3, 8, device=device)
        x[1, 2] = special
        torch.testing.assert_close(fr.softmax(x, -1), torch.softmax(x, -1), equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_of_zero_width_rows(device):
    x = torch.randn(3, 0, device=device)
    out, mean, rstd = ops.layer_norm(x, [0])
    _, mean_t, rstd_t = torch.ops.aten.native_layer_norm(x.cpu(), [0], None, None, 1e-5)
    assert out.shape == (3, 0)
    torch.testing.assert_close(mean.cpu().to(mean_t.dtype), mean_t, equal_nan=True)
    torch.testing.assert_close(rstd.cpu().to(rstd_t.dtype), rstd_t, equal_nan=True)


def test_cross_entropy_backward_checks_targets_on_the_cpu():
    x = torch.randn(2, 5)
    target = torch.tensor([1, 2])
    _, lse = ops.cross_entropy(x, target)
    with pytest.raises(RuntimeError, match="'target' holds class 7"):
        ops.cross_entropy_backward(torch.ones(()), None, x, torch.tensor([1, 7]), lse, "mean", -100, 0.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_of_huge_tied_logits(device, label_smoothing):
    for value in (1e4, 1e18):
        x = torch.full((1, 5), value, device=device)
        target = torch.tensor([1], device=device)
        expected = F.cross_entropy(x.double(), target, label_smoothing=label_smoothing)
        got = fr.cross_entropy(x, target, label_smoothing=label_smoothing)
        torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
    x = torch.randn(16, 50, device=device) * 100 + 1e4
    target = torch.randint(0, 50, (16,), device=device)
    torch.testing.assert_close(fr.cross_entropy(x, target, reduction="none").double(),
                               F.cross_entropy(x.double(), target, reduction="none"), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_add_rms_norm_eps_follows_the_promoted_dtype(device):
    x = torch.randn(4, 16, device=device) * 1e-5
    residual = torch.randn(4, 16, device=device, dtype=torch.float64) * 1e-5
    out, residual_out = fr.add_rms_norm(x, residual, 16)
    assert residual_out.dtype == torch.float64
    torch.testing.assert_close(out, F.rms_norm(x + residual, (16,)))


def test_cpu_layer_norm_of_long_rows():
    x = torch.randn(2, 2**20 + 3) + 3
    _, mean, rstd = ops.layer_norm(x, [x.shape[1]])
    x64 = x.double()
    expected_rstd = (x64.var(1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
    assert ((rstd.double() - expected_rstd).abs() / expected_rstd).max() < 1e-6
    torch.testing.assert_close(mean.double(), x64.mean(1, keepdim=True), rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_norm_refuses_a_narrowing_dtype(device):
    with pytest.raises(RuntimeError, match="without narrowing"):
        fr.norm(torch.randn(3, device=device, dtype=torch.float64), dtype=torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_any_all_over_no_dims(device):
    x = torch.tensor([[0.0, 1.0], [0.0, 0.0]], device=device)
    for ours, theirs in ((fr.any, torch.any), (fr.all, torch.all)):
        for t in (x, x.to(torch.uint8)):
            expected = theirs(t, dim=[])
            got = ours(t, dim=[])
            assert got.dtype == expected.dtype and torch.equal(got, expected)


@pytest.mark.parametrize("op", ["sum", "prod"])
def test_integer_result_of_an_input_wanting_grad(op):
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="Autograd not support dtype: Long"):
        getattr(x, op)(dtype=torch.int64)
    with pytest.raises(RuntimeError, match="Autograd not support dtype"):
        getattr(fr, op)(x, dtype=torch.int64)


def test_fake_rms_norm_checks_the_weight_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.empty(4, 8), torch.empty(5)
        with pytest.raises(Exception, match="'weight'"):
            ops.rms_norm(x, [8], w)
