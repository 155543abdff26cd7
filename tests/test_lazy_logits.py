"""LazyLogits: F.linear's logits computed only when needed. Whatever reads
them gets what the computed logits give; a view keeping the vocab last, a
bias over the vocab and F.cross_entropy keep them uncomputed."""

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICES
from fastreduce_torch.lazy_logits import LazyLogits


def inputs(device, dtype=torch.float64):
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 16, device=device, dtype=dtype, requires_grad=True)
    weight = torch.randn(37, 16, device=device, dtype=dtype, requires_grad=True)
    bias = torch.randn(37, device=device, dtype=dtype, requires_grad=True)
    final = torch.randn(1, 37, device=device, dtype=dtype)
    target = torch.randint(0, 37, (15,), device=device)
    target[::4] = -100
    return hidden, weight, bias, final, target


def grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore_index", [-100, 5])
def test_cross_entropy_of_a_view_with_biases_is_fused(device, reduction, smoothing, ignore_index):
    hidden, weight, bias, final, target = inputs(device)
    target = torch.where(target == -100, ignore_index, target)
    lazy = LazyLogits(hidden, weight, bias, hidden.dtype)
    LazyLogits.materializations = 0
    viewed = (lazy.to(device) + final.to(device)).view(-1, lazy.size(-1))
    assert isinstance(viewed, LazyLogits) and viewed.shape == (15, 37)
    got = F.cross_entropy(viewed, target, ignore_index=ignore_index, reduction=reduction,
                          label_smoothing=smoothing)
    assert LazyLogits.materializations == 0 and type(got) is torch.Tensor
    logits = (F.linear(hidden, weight, bias) + final).view(-1, 37)
    expected = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=smoothing)
    torch.testing.assert_close(got, expected)
    seed = torch.randn_like(expected)
    for a, b in zip(grads((got * seed).sum(), hidden, weight, bias), grads((expected * seed).sum(), hidden, weight, bias)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_anything_else_reads_the_computed_logits(device):
    hidden, weight, bias, final, target = inputs(device)
    lazy = LazyLogits(hidden, weight, bias, hidden.dtype)
    logits = F.linear(hidden, weight, bias)
    addend = torch.randn(3, 1, 37, device=device, dtype=hidden.dtype)
    classes = torch.rand(37, device=device, dtype=hidden.dtype)
    LazyLogits.materializations = 0
    cases = [
        (lambda x: x[:, :-1].softmax(-1), "a slice"),
        (lambda x: x.float() * 2, "a scale"),
        (lambda x: x.view(-1), "a view that moves the vocab"),
        (lambda x: x + final.float(), "a bias of another dtype"),
        (lambda x: x + addend, "an addend over more than the vocab"),
        (lambda x: F.cross_entropy(x.view(-1, 37), target, weight=classes),
         "class weights"),
        (lambda x: F.cross_entropy(x.transpose(1, 2), target.view(3, 5).clamp(min=0)), "classes in dim 1"),
        (lambda x: F.cross_entropy(x.view(-1, 37), x.view(-1, 37).softmax(-1).detach()), "probabilities"),
        (lambda x: x.to(torch.float32), "another dtype"),
        (lambda x: x.argmax(-1), "argmax"),
    ]
    for i, (read, what) in enumerate(cases):
        torch.testing.assert_close(read(lazy), read(logits), msg=what)
        assert LazyLogits.materializations > i, what
    assert lazy.to(device) is lazy and lazy.contiguous() is lazy
    assert "LazyLogits" in repr(lazy) and lazy.shape == logits.shape and lazy.dtype == logits.dtype


@pytest.mark.parametrize("device", DEVICES)
def test_materialized_logits_carry_gradients(device):
    hidden, weight, bias, final, _ = inputs(device)
    lazy = LazyLogits(hidden, weight, bias, hidden.dtype) + final
    got = grads(lazy.square().sum(), hidden, weight, bias)
    expected = grads((F.linear(hidden, weight, bias) + final).square().sum(), hidden, weight, bias)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_half_logits_of_float_hidden_under_autocast():
    # A LazyLogits made under autocast has the autocast dtype: its hidden
    # states and weight are cast as F.linear casts them.
    hidden, weight, bias, _, target = inputs("cpu", torch.float32)
    lazy = LazyLogits(hidden, weight, bias, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(hidden, weight, bias)
        got = F.cross_entropy(lazy.view(-1, 37), target)
        expected = F.cross_entropy(logits.view(-1, 37), target)
    torch.testing.assert_close(lazy * 1, logits)
    assert got.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=0)
