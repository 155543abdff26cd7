"""fused_linear_cross_entropy against F.cross_entropy of the full logits in
float64: every option through forward and backward, on the CPU and CUDA."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import fastreduce_torch as fr
from conftest import DEVICES, error_vs_reference, requires_cuda

OPTIONS = list(itertools.product([False, True], ["mean", "sum", "none"], [0.0, 0.1], [None, 3.0]))


def reference(hidden, weight, target, bias, reduction, label_smoothing, softcap):
    logits = F.linear(hidden, weight, bias)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits.double(), target, reduction=reduction, label_smoothing=label_smoothing)


def inputs(device, dtype, rows=37, width=16, classes=53, bias=False):
    hidden = torch.randn(rows, width, device=device, dtype=dtype, requires_grad=True)
    weight = (torch.randn(classes, width, device=device, dtype=dtype) / width**0.5).requires_grad_()
    b = torch.randn(classes, device=device, dtype=dtype, requires_grad=True) if bias else None
    target = torch.randint(0, classes, (rows,), device=device)
    target[::5] = -100
    return hidden, weight, target, b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias,reduction,label_smoothing,softcap", OPTIONS, ids=str)
def test_matches_full_logits(device, dtype, bias, reduction, label_smoothing, softcap):
    hidden, weight, target, b = inputs(device, dtype, bias=bias)
    params = [t for t in (hidden, weight, b) if t is not None]
    expected = reference(hidden, weight, target, b, reduction, label_smoothing, softcap)
    grad_out = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, params, grad_out)
    loss = fr.fused_linear_cross_entropy(hidden, weight, target, b, reduction=reduction,
                                         label_smoothing=label_smoothing, softcap=softcap)
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert loss.shape == expected.shape
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(torch.autograd.grad(loss, params, grad_out.to(loss.dtype)), expected_grads):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
def test_leading_dims(device):
    # Leading dims over 300 rows of 70000 float32 classes: three chunks of
    # the 32 MiB least budget.
    hidden = torch.randn(3, 100, 8, device=device, requires_grad=True)
    weight = torch.randn(70000, 8, device=device, requires_grad=True)
    target = torch.randint(0, 70000, (3, 100), device=device)
    loss = fr.fused_linear_cross_entropy(hidden, weight, target)
    expected = F.cross_entropy((hidden @ weight.T).reshape(-1, 70000).double(), target.reshape(-1))
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
    loss.backward()
    grad_hidden, grad_weight = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    F.cross_entropy((hidden @ weight.T).reshape(-1, 70000), target.reshape(-1)).backward()
    torch.testing.assert_close(grad_hidden, hidden.grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(grad_weight, weight.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_all_ignored_and_empty(device):
    hidden, weight, target, _ = inputs(device, torch.float32, rows=4)
    target[:] = -100
    expected = F.cross_entropy(hidden @ weight.T, target)
    loss = fr.fused_linear_cross_entropy(hidden, weight, target)
    assert torch.isnan(loss) and torch.isnan(expected)
    assert fr.fused_linear_cross_entropy(hidden, weight, target, reduction="sum").item() == 0.0
    empty = fr.fused_linear_cross_entropy(hidden[:0], weight, target[:0], reduction="none")
    assert empty.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias,reduction,label_smoothing,softcap", OPTIONS, ids=str)
@pytest.mark.parametrize("incoming", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("counted", ["some", "none"])
def test_non_finite_incoming_gradient(device, bias, reduction, label_smoothing, softcap, incoming, counted):
    # What torch's backward never scales stays as it is: the ignored rows of
    # the hidden states' gradient, and the weight's and bias's when every row
    # is ignored (0, where 0 * inf would be NaN). Elsewhere ours is as finite
    # as torch's.
    hidden, weight, target, b = inputs(device, torch.float32, rows=11, bias=bias)
    if counted == "none":
        target[:] = -100
    params = [t for t in (hidden, weight, b) if t is not None]
    expected = reference(hidden, weight, target, b, reduction, label_smoothing, softcap)
    g = torch.full_like(expected, incoming)
    expected_grads = torch.autograd.grad(expected, params, g)
    loss = fr.fused_linear_cross_entropy(hidden, weight, target, b, reduction=reduction,
                                         label_smoothing=label_smoothing, softcap=softcap)
    grads = torch.autograd.grad(loss, params, g.to(loss.dtype))
    ignored = target == -100
    assert torch.equal(grads[0][ignored].double(), expected_grads[0][ignored].double())
    for got, want in zip(grads, expected_grads):
        assert torch.equal(got.isfinite(), want.isfinite())
    if counted == "none":
        for got, want in zip(grads, expected_grads):
            assert torch.equal(got.double(), want.double())


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_name_the_argument(device):
    hidden, weight, target, _ = inputs(device, torch.float32)
    op = torch.ops.fastreduce.fused_linear_cross_entropy
    with pytest.raises(RuntimeError, match="'weight'"):
        op(hidden, weight[:, :3], target)
    with pytest.raises(RuntimeError, match="'weight'"):
        op(hidden, weight.double(), target)
    with pytest.raises(RuntimeError, match="'target'"):
        op(hidden, weight, target[:3])
    with pytest.raises(RuntimeError, match="'bias'"):
        op(hidden, weight, target, torch.zeros(3, device=device))
    with pytest.raises(RuntimeError, match="'reduction'"):
        op(hidden, weight, target, None, "avg")
    with pytest.raises(RuntimeError, match="'softcap'"):
        op(hidden, weight, target, None, "mean", -100, 0.0, -1.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias,reduction,label_smoothing,softcap", OPTIONS, ids=str)
def test_opcheck(device, bias, reduction, label_smoothing, softcap):
    hidden, weight, target, b = inputs(device, torch.float32, rows=9, classes=11, bias=bias)
    args = (hidden, weight, target, b, reduction, -100, label_smoothing, softcap)
    torch.library.opcheck(torch.ops.fastreduce.fused_linear_cross_entropy.default, args)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("rows, classes", [(600, 5001), (300, 50257), (256, 50304)])
@pytest.mark.parametrize("bias,reduction,label_smoothing,softcap", OPTIONS[::3], ids=str)
def test_vocabularies_of_any_width(rows, classes, bias, reduction, label_smoothing, softcap):
    # Chunk logits are rows of an odd vocabulary in a wider buffer (GPT-2's
    # 50257 in rows of 50304) or, at a multiple of 64, contiguous: rows that
    # one block takes in turn or a cluster splits. bfloat16 loss and
    # gradients within twice the error of torch's own (F.linear, then
    # F.cross_entropy) from float64.
    hidden, weight, target, b = inputs("cuda", torch.bfloat16, rows=rows, width=64, classes=classes, bias=bias)
    params = [t for t in (hidden, weight, b) if t is not None]
    wide = [t.detach().double().requires_grad_() for t in params]
    expected = reference(wide[0], wide[1], target, wide[2] if bias else None, reduction, label_smoothing, softcap)
    grad_out = torch.rand_like(expected) + 0.5
    expected_grads = torch.autograd.grad(expected, wide, grad_out)
    theirs = reference(hidden, weight, target, b, reduction, label_smoothing, softcap)
    loss = fr.fused_linear_cross_entropy(hidden, weight, target, b, reduction=reduction,
                                         label_smoothing=label_smoothing, softcap=softcap)
    error_vs_reference(loss, theirs, expected, floor=2**-8 * expected.abs().max().item())
    theirs_grads = torch.autograd.grad(theirs, params, grad_out)
    for got, their, want in zip(torch.autograd.grad(loss, params, grad_out.float()), theirs_grads, expected_grads):
        assert got.dtype == torch.bfloat16
        error_vs_reference(got, their, want, floor=2**-8 * want.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_half_inputs_forward_and_backward(device, dtype, reduction):
    hidden, weight, target, b = inputs(device, dtype, bias=True)
    params = [hidden, weight, b]
    expected = F.cross_entropy(F.linear(hidden, weight, b).float(), target, reduction=reduction, label_smoothing=0.1)
    grad_out = torch.rand_like(expected)
    expected_grads = torch.autograd.grad(expected, params, grad_out)
    loss = fr.fused_linear_cross_entropy(hidden, weight, target, b, reduction=reduction, label_smoothing=0.1)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=1e-2, atol=1e-2)
    for got, want in zip(torch.autograd.grad(loss, params, grad_out), expected_grads):
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_half_softcap_saturated_gradients(device, dtype, reduction):
    # Logits soft-capped in a half dtype (the contract, as Gemma 2 in
    # transformers), nearly all deep in tanh's saturation: the cap's
    # derivative from 1 - tanh^2 of half values is all rounding there
    # (bfloat16: 10% of the largest gradient from float64; transformers'
    # autograd the same); as 1 / cosh^2 of the logits before the cap, 1%.
    # Against float64 at the logits rounded to the dtype; both gradient paths
    # (mean: in the forward; none: the backward op).
    torch.manual_seed(0)
    rows, width, classes, cap = 37, 16, 53, 3.0
    hidden = (torch.randn(rows, width, device=device) * 300).to(dtype).requires_grad_()
    weight = (torch.randn(classes, width, device=device) / width**0.5).to(dtype).requires_grad_()
    target = torch.randint(0, classes, (rows,), device=device)
    loss = fr.fused_linear_cross_entropy(hidden, weight, target, reduction=reduction, label_smoothing=0.1,
                                         softcap=cap)
    g = torch.rand_like(loss)
    grads = torch.autograd.grad(loss, (hidden, weight), g)
    h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    z = F.linear(h64, w64)
    z = z + (z.detach().to(dtype).double() - z.detach())  # rounded as the contract's logits, straight through
    expected = F.cross_entropy(torch.tanh(z / cap) * cap, target, reduction=reduction, label_smoothing=0.1)
    assert (1 - torch.tanh(z.detach() / cap) ** 2 < torch.finfo(dtype).eps).float().mean() > 0.9
    for got, want in zip(grads, torch.autograd.grad(expected, (h64, w64), g.double())):
        assert got.dtype == dtype
        error = (got.double() - want).abs().max() / want.abs().max()
        assert error < {torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype], error.item()


@pytest.mark.parametrize("device", DEVICES)
def test_float16_softcap_derivative_past_cosh_overflow(device):
    # float16 logits at 6.4-11 times the cap: cosh^2 of them overflows
    # float16, yet the cap's derivative there (1e-5 to 1e-9) is a float16
    # number; with a large incoming gradient it is all of the gradient.
    # Against float64 at the logits rounded to float16 (fuzz case 335250).
    # The backward op (reduction none); mean and sum make the gradient in the
    # forward, at an incoming gradient of 1, where these underflow float16.
    reduction = "none"
    torch.manual_seed(0)
    rows, classes, cap = 29, 41, 3.0
    hidden = torch.full((rows, 1), 2.0, device=device, dtype=torch.float16, requires_grad=True)
    scale = (3.2 + 2.3 * torch.rand(classes, 1, device=device)) * cap
    weight = (scale * torch.randn(classes, 1, device=device).sign()).half().requires_grad_()
    target = torch.randint(0, classes, (rows,), device=device)
    loss = fr.fused_linear_cross_entropy(hidden, weight, target, reduction=reduction, softcap=cap)
    g = torch.full_like(loss, 1000.0)
    grads = torch.autograd.grad(loss, (hidden, weight), g)
    h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    z = F.linear(h64, w64)
    z = z + (z.detach().half().double() - z.detach())
    expected = F.cross_entropy(torch.tanh(z / cap) * cap, target, reduction=reduction)
    for got, want in zip(grads, torch.autograd.grad(expected, (h64, w64), g.double())):
        assert want.abs().max() > 0
        torch.testing.assert_close(got.double(), want, rtol=0, atol=5e-3 * want.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("special", [float("nan"), float("inf"), 1e30])
def test_special_values_like_torch(device, special):
    hidden, weight, target, _ = inputs(device, torch.float32)
    hidden = hidden.detach().clone()
    hidden[3, 2] = special
    expected = F.cross_entropy(F.linear(hidden, weight.detach()), target, reduction="none")
    got = fr.fused_linear_cross_entropy(hidden, weight.detach(), target, reduction="none")
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(got[finite], expected[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_one_class_gradients_are_zero(device, label_smoothing):
    # One class: every row's softmax is 1, so torch's gradients are exactly 0
    # even for huge activations and gradients (an ulp of g * (1 - eps) left
    # over made them +-inf in the weight's gradient).
    hidden = (torch.randn(7, 16, device=device) * 1e30).requires_grad_()
    weight = torch.randn(1, 16, device=device, requires_grad=True)
    target = torch.zeros(7, dtype=torch.long, device=device)
    grad_out = torch.randn(7, device=device) * 2e30
    loss = fr.fused_linear_cross_entropy(hidden, weight, target, reduction="none", label_smoothing=label_smoothing)
    grads = torch.autograd.grad(loss, (hidden, weight), grad_out)
    expected = F.cross_entropy(F.linear(hidden, weight), target, reduction="none", label_smoothing=label_smoothing)
    want = torch.autograd.grad(expected, (hidden, weight), grad_out)
    for got, w in zip(grads, want):
        assert torch.equal(w, torch.zeros_like(w))
        assert torch.equal(got, w)


@requires_cuda
@pytest.mark.cuda
def test_mixed_devices_are_refused():
    hidden, weight, target, b = inputs("cuda", torch.float32, bias=True)
    op = torch.ops.fastreduce.fused_linear_cross_entropy
    for args, name in (((hidden, weight.cpu(), target, b), "weight"), ((hidden, weight, target.cpu(), b), "target"),
                       ((hidden, weight, target, b.cpu()), "bias")):
        with pytest.raises(RuntimeError, match=f"'{name}' is on cpu"):
            op(*args)
    loss, lse = op(hidden, weight, target, b, "none")
    with pytest.raises(RuntimeError, match="'lse'|'target'|'weight'"):
        torch.ops.fastreduce.fused_linear_cross_entropy_backward(torch.ones_like(loss), hidden, weight, target.cpu(),
                                                                 b, lse, "none", -100, 0.0, None)
    torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
def test_compiles_without_graph_breaks(device):
    hidden, weight, target, _ = inputs(device, torch.float32)

    def step(h, w):
        return fr.fused_linear_cross_entropy(h, w, target, softcap=5.0)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(hidden, weight)
    loss.backward()
    expected_grads = (hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    step(hidden, weight).backward()
    torch.testing.assert_close(loss, step(hidden, weight))
    torch.testing.assert_close(expected_grads[0], hidden.grad)
    torch.testing.assert_close(expected_grads[1], weight.grad)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bfloat16_autocast_and_memory():
    # float32 logits of 4096 x 128000 would be 2000 MiB: two chunks of 500 MiB
    hidden = torch.randn(4096, 256, device="cuda", requires_grad=True)
    weight = (torch.randn(128000, 256, device="cuda") / 16).requires_grad_()
    target = torch.randint(0, 128000, (4096,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        expected = F.cross_entropy(F.linear(hidden, weight).float(), target)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss = fr.fused_linear_cross_entropy(hidden, weight, target)
    peak = torch.cuda.max_memory_allocated() - before
    torch.testing.assert_close(loss, expected, rtol=2e-3, atol=2e-3)
    # one chunk (at most 512 MiB), bf16 copies of the weight and its gradient, and a little more
    assert peak < 2**29 + 3 * 128000 * 256 * 2, peak
    loss.backward()
    assert hidden.grad.dtype == torch.float32 and torch.isfinite(weight.grad).all()


def test_second_backward_refused_not_doubled():
    hidden, weight, target, _ = inputs("cpu", torch.float32)
    loss = fr.fused_linear_cross_entropy(hidden, weight, target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
