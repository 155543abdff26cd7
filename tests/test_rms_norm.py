"""rms_norm and the fused residual add + norms (add_layer_norm, add_rms_norm)
against float64 references and torch, forward and backward, every option;
gradcheck, opcheck, compile, autocast, modules and CUDA graphs of the
transformer row ops (with cross-entropy, whose own tests are in
test_losses.py)."""

import pytest
import torch
import torch.nn.functional as F

import fastreduce_torch as fr
from conftest import TOLERANCE, DEVICES, close_to_reference, offset_view, requires_cuda, side_stream_then_graph

LOW = [torch.float32, torch.float16, torch.bfloat16]
# 1, 33: element-wise rows; 200, 768: warp rows; 1500, 4096: block rows in
# registers; 20000: past the registers (shared memory or streamed).
WIDTHS = [1, 33, 200, 768, 1500, 4096, 20000]


def default_eps(dtype):
    """rms_norm's eps=None: float32's epsilon, float64's for float64 input (as torch)."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def rms_reference(x, shape, weight, eps):
    dims = tuple(range(-len(shape), 0))
    eps = default_eps(x.dtype) if eps is None else eps
    h = x.double()
    out = h * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)
    return out * weight.double() if weight is not None else out


def grads_of(fn, inputs, grad_outputs):
    """Gradients of fn(*inputs) (a tensor or a tuple) for the inputs that need them."""
    outputs = fn(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    wanted = [t for t in inputs if t is not None and t.requires_grad]
    return outputs, torch.autograd.grad(outputs, wanted, grad_outputs[: len(outputs)], allow_unused=True)


def leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) if t is not None else None for t in tensors]


# ---- rms_norm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_forward_and_backward(device, dtype, n, with_weight):
    rows = 3 if n > 4096 else 37
    x = (torch.randn(rows, n, device=device) * 2 + 0.5).to(dtype)
    w = (torch.randn(n, device=device) + 1).to(dtype) if with_weight else None
    g = torch.randn(rows, n, device=device).to(dtype)
    x_, w_ = leaves(x, w)
    (out,), grads = grads_of(lambda x, w: fr.rms_norm(x, n, w), (x_, w_), (g,))
    assert out.dtype == dtype and out.shape == x.shape
    x64, w64 = leaves(x.double(), w.double() if w is not None else None)
    (ref,), ref_grads = grads_of(lambda x, w: rms_reference(x, [n], w, default_eps(dtype)),
                                     (x64, w64), (g.double(),))
    close_to_reference(out, ref)
    torch.testing.assert_close(out, F.rms_norm(x, [n], w), rtol=TOLERANCE[dtype] * 4, atol=TOLERANCE[dtype] * 4)
    _, torch_grads = grads_of(lambda x, w: F.rms_norm(x, [n], w), leaves(x, w), (g,))
    for ours, reference, theirs in zip(grads, ref_grads, torch_grads):
        close_to_reference(ours, reference, theirs=theirs)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_eps_shapes_and_layouts(device):
    x = torch.randn(2, 3, 4, 5, device=device)
    for shape in ([5], [4, 5], [3, 4, 5]):
        for eps in (None, 1e-3):
            w = torch.randn(shape, device=device)
            torch.testing.assert_close(fr.rms_norm(x, shape, w, eps), F.rms_norm(x, shape, w, eps))
    tiny = torch.full((2, 4), 1e-3, device=device)  # the default eps matters here
    torch.testing.assert_close(fr.rms_norm(tiny, 4), F.rms_norm(tiny, [4]))
    torch.testing.assert_close(fr.rms_norm(tiny.half(), 4), F.rms_norm(tiny.half(), [4]))
    transposed = torch.randn(64, 40, device=device).t()
    torch.testing.assert_close(fr.rms_norm(transposed, 64), F.rms_norm(transposed, [64]))
    shifted = offset_view(torch.randn(9, 48, device=device), 1)
    torch.testing.assert_close(fr.rms_norm(shifted, 48), F.rms_norm(shifted, [48]))
    out, rstd = torch.ops.fastreduce.rms_norm(x, [4, 5], None, None)
    assert rstd.shape == (2, 3, 1, 1)
    assert fr.rms_norm(torch.randn(0, 8, device=device), 8).shape == (0, 8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_float_weight_with_half_input(device, dtype):
    x = torch.randn(16, 256, device=device).to(dtype)
    w = torch.randn(256, device=device, requires_grad=True)
    x_ = x.clone().requires_grad_(True)
    out = fr.rms_norm(x_, 256, w)
    assert out.dtype == dtype
    close_to_reference(out, rms_reference(x, [256], w.detach(), default_eps(dtype)))
    out.backward(torch.ones_like(out))
    assert w.grad.dtype == torch.float32 and x_.grad.dtype == dtype


# ---- fused residual add + norm


def add_norm_reference(kind, x, r, shape, w, b, eps):
    """The unfused computation: h rounded to the input dtype as torch's add."""
    h = (x + r).double() if x.dtype != torch.float64 else x + r
    if kind == "layer":
        return F.layer_norm(h, shape, w, b, eps), h
    return rms_reference(h, shape, w, eps), h


def torch_add_norm(kind, x, r, shape, w, b, eps):
    """torch's own unfused computation in the inputs' dtype."""
    h = x + r
    return (F.layer_norm(h, shape, w, b, eps) if kind == "layer" else F.rms_norm(h, shape, w, eps)), h


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [1, 33, 768, 1500, 4096, 20000])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_add_norm_forward_and_backward(device, dtype, n, kind):
    rows = 3 if n > 4096 else 29
    shape = [n]
    x = torch.randn(rows, n, device=device).to(dtype)
    r = (torch.randn(rows, n, device=device) * 2).to(dtype)
    options = [(True, True), (True, False), (False, False)] if kind == "layer" else [(True, False), (False, False)]
    for with_weight, with_bias in options:
        w = torch.randn(n, device=device).to(dtype) if with_weight else None
        b = torch.randn(n, device=device).to(dtype) if with_bias else None
        g_out = torch.randn(rows, n, device=device).to(dtype)
        g_res = torch.randn(rows, n, device=device).to(dtype)
        if kind == "layer":
            fn = lambda x, r, w, b: fr.add_layer_norm(x, r, shape, w, b, 1e-5)  # noqa: E731
        else:
            fn = lambda x, r, w, b: fr.add_rms_norm(x, r, shape, w, 1e-6)  # noqa: E731
        inputs = leaves(x, r, w, b)
        (out, h), grads = grads_of(fn, inputs, (g_out, g_res))
        ref_inputs = leaves(*(t.double() if t is not None else None for t in (x, r, w, b)))
        eps = 1e-5 if kind == "layer" else 1e-6
        (ref_out, ref_h), ref_grads = grads_of(
            lambda x, r, w, b: add_norm_reference(kind, x, r, shape, w, b, eps),
            ref_inputs, (g_out.double(), g_res.double()))
        torch.testing.assert_close(h, (x.float() + r.float()).to(dtype), rtol=0, atol=0)
        # The norm of the rounded h: compare with the reference on that h.
        expected, _ = add_norm_reference(kind, h.double(), torch.zeros_like(h, dtype=torch.float64), shape,
                                         w.double() if w is not None else None,
                                         b.double() if b is not None else None, eps)
        close_to_reference(out, expected)
        assert len(grads) == len(ref_grads)
        _, torch_grads = grads_of(lambda x, r, w, b: torch_add_norm(kind, x, r, shape, w, b, eps),
                                  leaves(x, r, w, b), (g_out, g_res))
        for ours, reference, theirs in zip(grads, ref_grads, torch_grads):
            close_to_reference(ours, reference, theirs=theirs)
        torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)  # d input = d residual


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_add_norm_mixed_dtypes_promote_like_add(device, kind):
    """A float32 residual stream beside bfloat16 sublayer outputs (autocast)."""
    x = torch.randn(6, 64, device=device).bfloat16()
    r = torch.randn(6, 64, device=device)
    w = torch.randn(64, device=device)
    fn = fr.add_layer_norm if kind == "layer" else fr.add_rms_norm
    inputs = leaves(x, r, w)
    (out, h), grads = grads_of(lambda x, r, w: fn(x, r, 64, w), inputs, (torch.ones(6, 64, device=device),) * 2)
    (ref_out, ref_h), ref_grads = grads_of(lambda x, r, w: torch_add_norm(kind, x, r, [64], w, None, 1e-5
                                                                          if kind == "layer" else None),
                                           leaves(x, r, w), (torch.ones(6, 64, device=device),) * 2)
    assert out.dtype == h.dtype == torch.float32
    torch.testing.assert_close(h, ref_h)
    torch.testing.assert_close(out, ref_out)
    for ours, theirs in zip(grads, ref_grads):
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_add_norm_only_one_output_used(device):
    x, r = leaves(torch.randn(5, 64, device=device), torch.randn(5, 64, device=device))
    out, h = fr.add_rms_norm(x, r, 64)
    out.sum().backward()  # h unused: its gradient is zero
    x2, r2 = leaves(x.detach(), r.detach())
    F.rms_norm(x2 + r2, [64]).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    x3, r3 = leaves(x.detach(), r.detach())
    fr.add_layer_norm(x3, r3, 64)[1].pow(2).sum().backward()  # only h used
    torch.testing.assert_close(x3.grad, 2 * (x + r).detach())


# ---- gradcheck, opcheck, compile, autocast, modules


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    def t(*shape):
        return torch.randn(*shape, dtype=torch.float64, device=device, requires_grad=True)

    x, r, w, b = t(3, 4, 6), t(3, 4, 6), t(6), t(6)
    assert torch.autograd.gradcheck(lambda x, w: fr.rms_norm(x, 6, w), (x, w))
    assert torch.autograd.gradcheck(lambda x: fr.rms_norm(x, [4, 6]), (x,))
    assert torch.autograd.gradcheck(lambda x, r, w, b: fr.add_layer_norm(x, r, 6, w, b), (x, r, w, b))
    assert torch.autograd.gradcheck(lambda x, r, w: fr.add_rms_norm(x, r, 6, w), (x, r, w))
    logits = t(5, 7)
    target = torch.tensor([0, 6, -100, 3, 3], device=device)
    for reduction in ("mean", "sum", "none"):
        assert torch.autograd.gradcheck(
            lambda x: fr.cross_entropy(x, target, reduction=reduction, label_smoothing=0.2, return_lse=True),
            (logits,))


def samples(device):
    x = torch.randn(4, 24, device=device, requires_grad=True)
    r = torch.randn(4, 24, device=device, requires_grad=True)
    w = torch.randn(24, device=device, requires_grad=True)
    b = torch.randn(24, device=device, requires_grad=True)
    target = torch.tensor([1, -100, 23, 0], device=device)
    zero_ignored = torch.tensor([1, 0, 23, 0], device=device)
    ops = torch.ops.fastreduce
    return [
        (ops.rms_norm.default, (x, [24], w, None), {}),
        (ops.rms_norm.default, (x, [24], None, 1e-3), {}),
        (ops.add_layer_norm.default, (x, r, [24], w, b, 1e-5), {}),
        (ops.add_layer_norm.default, (x, r, [24], None, None, 1e-5), {}),
        (ops.add_rms_norm.default, (x, r, [24], w, None), {}),
        (ops.cross_entropy.default, (x, target, "mean", -100, 0.1), {}),
        (ops.cross_entropy.default, (x, zero_ignored, "none", 0, 0.0), {}),
        (ops._cross_entropy_with_grad.default, (x.detach(), target, "mean", -100, 0.1), {}),
        (ops._cross_entropy_with_grad_.default, (x.detach().clone(), target, "sum", -100, 0.0), {}),
        (ops._scale_unless_one_.default, (x.detach().clone(), torch.tensor(2.0, device=device)), {}),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args, kwargs in samples(device):
        torch.library.opcheck(op, args, kwargs)


class LlamaBlock(torch.nn.Module):
    """Pre-norm residual stream with RMSNorm and a cross-entropy head."""

    def __init__(self, width=32, vocab=50):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.RMSNorm(width), torch.nn.RMSNorm(width)
        self.mix, self.mlp = torch.nn.Linear(width, width), torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, x, target):
        y, h = fr.add_rms_norm(self.mix(self.norm1(x)), x, x.shape[-1], self.norm2.weight)
        h = h + self.mlp(y)
        return fr.cross_entropy(self.head(h).flatten(0, -2), target.flatten(), label_smoothing=0.1)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_forward_and_backward(device):
    block = LlamaBlock().to(device)
    assert fr.patch(block) == 2
    x = torch.randn(2, 9, 32, device=device, requires_grad=True)
    target = torch.randint(0, 50, (2, 9), device=device)
    eager = block(x, target)
    (eager_grad,) = torch.autograd.grad(eager, x)
    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    out = compiled(x, target)
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)
    (grad,) = torch.autograd.grad(out, x)
    torch.testing.assert_close(grad, eager_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_output_dtypes(device, dtype):
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("CPU autocast is bfloat16")
    x = torch.randn(4, 16, device=device)
    w = torch.randn(16, device=device)
    target = torch.randint(0, 16, (4,), device=device)
    with torch.autocast(device, dtype=dtype):
        cases = [
            (fr.rms_norm(x.to(dtype), 16, w), F.rms_norm(x.to(dtype), [16], w)),
            (fr.cross_entropy(x.to(dtype), target), F.cross_entropy(x.to(dtype), target)),
            (fr.cross_entropy(x, target), F.cross_entropy(x, target)),
        ]
    for ours, theirs in cases:
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_module_and_patch(device):
    ref = torch.nn.RMSNorm(12, eps=1e-4).to(device)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
    ours = fr.nn.RMSNorm(12, eps=1e-4).to(device)
    ours.load_state_dict(ref.state_dict())
    assert set(ours.state_dict()) == set(ref.state_dict())
    x = torch.randn(3, 12, device=device)
    torch.testing.assert_close(ours(x), ref(x))
    model = torch.nn.Sequential(torch.nn.RMSNorm(12), torch.nn.RMSNorm(12, elementwise_affine=False),
                                torch.nn.LayerNorm(12)).to(device)
    expected = model(x)
    assert fr.patch(model) == 3
    assert type(model[0]) is fr.nn.RMSNorm and type(model[1]) is fr.nn.RMSNorm
    torch.testing.assert_close(model(x), expected)


@requires_cuda
@pytest.mark.cuda
def test_cuda_graph_capture_and_determinism():
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    logits = torch.randn(256, 5000, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, 5000, (256,), device="cuda")

    def step():
        out, h = fr.add_rms_norm(x, r, 1024, w)
        loss = fr.cross_entropy(logits, target, label_smoothing=0.1)
        (dw,) = torch.autograd.grad(out.float().square().sum(), w)
        return out, h, loss, dw

    expected, captured = side_stream_then_graph(step)
    for a, b in zip(captured, expected):
        assert torch.equal(a, b)  # bitwise: the same kernels, no atomics
