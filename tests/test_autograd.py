"""fastreduce inside real models: every affine option through backward, autocast
and mixed dtypes as torch has them, compiled backward of every op, and the
C++ autograd's no-grad path."""

import copy
import gc
import itertools
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import fastreduce_torch as fr
from conftest import DEVICES

AFFINE = list(itertools.product((True, False), repeat=2))


def assert_error_within_torch(ours, theirs, reference, floor):
    """Our error against the float64 reference stays within twice torch's own plus a floor."""
    ours_err = (ours.double() - reference).abs().max().item()
    theirs_err = (theirs.double() - reference).abs().max().item()
    assert ours_err <= 2 * theirs_err + floor, (ours_err, theirs_err)


# Widths that reach each CUDA kernel: warp rows (200, 768), block rows in
# registers (1600, 4096) and rows past the register kernels (12000 floats).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [200, 768, 1600, 4096, 12000])
@pytest.mark.parametrize("with_weight,with_bias", AFFINE)
def test_layer_norm_affine_options_forward_and_backward(device, dtype, n, with_weight, with_bias):
    rows = 5 if n > 4000 else 37
    x = (torch.randn(rows, n, device=device) * 2 + 0.5).to(dtype)
    w = torch.randn(n, device=device).to(dtype) if with_weight else None
    b = torch.randn(n, device=device).to(dtype) if with_bias else None
    g = torch.randn(rows, n, device=device).to(dtype)

    def grads(fn, x, w, b, g):
        leaves = [t.detach().requires_grad_() for t in (x, w, b) if t is not None]
        it = iter(leaves)
        args = [next(it) if t is not None else None for t in (x, w, b)]
        out = fn(args[0], [n], args[1], args[2], 1e-5)
        return (out, *torch.autograd.grad(out, leaves, g))

    ours = grads(fr.layer_norm, x, w, b, g)
    theirs = grads(F.layer_norm, x, w, b, g)
    reference = grads(F.layer_norm, *(t.double() if t is not None else None for t in (x, w, b, g)))
    assert len(ours) == len(theirs) == 2 + with_weight + with_bias
    floor = 1e-4 if dtype == torch.float32 else 3e-2
    for a, t, r in zip(ours, theirs, reference):
        assert a.dtype == t.dtype and a.shape == t.shape
        # Parameter gradients sum over rows: scale the floor with their size.
        assert_error_within_torch(a, t, r, floor * max(1.0, r.abs().max().item()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
def test_patched_layer_norm_without_bias_trains(device, bias):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32, bias=bias), torch.nn.Linear(32, 4))
    patched = copy.deepcopy(model)
    assert fr.patch(patched) == 1
    model.to(device), patched.to(device)
    x = torch.randn(8, 16, device=device)
    for m in (model, patched):
        m(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), patched.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


# ---- autocast: the drop-in gives torch's output dtypes and values.


def autocast_cases(device):
    x = torch.randn(6, 40, device=device)
    scores = torch.randn(2, 9, 9, device=device)
    upper = torch.ones(9, 9, dtype=torch.bool, device=device).triu(1)
    w, b = torch.randn(40, device=device), torch.randn(40, device=device)
    half = torch.randn(6, 40, device=device).half()
    return [
        ("sum", lambda: fr.sum(x, 1), lambda: torch.sum(x, 1)),
        ("sum dtype", lambda: fr.sum(x, 1, dtype=torch.float64), lambda: torch.sum(x, 1, dtype=torch.float64)),
        ("sum half", lambda: fr.sum(half, 0), lambda: torch.sum(half, 0)),
        ("mean", lambda: fr.mean(half, 1), lambda: torch.mean(half, 1)),
        ("prod", lambda: fr.prod(half[:, :4], 1), lambda: torch.prod(half[:, :4], 1)),
        ("amax", lambda: fr.amax(half, 1), lambda: torch.amax(half, 1)),
        ("amin", lambda: fr.amin(half, 0), lambda: torch.amin(half, 0)),
        ("softmax", lambda: fr.softmax(half, -1), lambda: torch.softmax(half, -1)),
        ("softmax dtype", lambda: fr.softmax(half, 0, dtype=torch.float16),
         lambda: torch.softmax(half, 0, dtype=torch.float16)),
        ("causal_softmax", lambda: fr.causal_softmax(scores.half(), 0.5),
         lambda: torch.softmax((0.5 * scores.half()).masked_fill(upper, float("-inf")), -1)),
        # A linear layer's output: low precision under autocast, the norm's
        # parameters float32.
        ("layer_norm", lambda: fr.layer_norm(F.linear(x, torch.eye(40, device=device)), 40, w, b),
         lambda: F.layer_norm(F.linear(x, torch.eye(40, device=device)), [40], w, b)),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_output_dtypes_and_values(device, dtype):
    for name, ours_fn, theirs_fn in autocast_cases(device):
        with torch.autocast(device, dtype=dtype):
            ours, theirs = ours_fn(), theirs_fn()
        assert ours.dtype == theirs.dtype, (name, ours.dtype, theirs.dtype)
        torch.testing.assert_close(ours, theirs, rtol=2e-2, atol=2e-2, msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [40, 768, 1600])
def test_layer_norm_float_parameters_with_half_input(device, dtype, n):
    x = (torch.randn(9, n, device=device) + 1).to(dtype).requires_grad_()
    w = torch.randn(n, device=device, requires_grad=True)
    b = torch.randn(n, device=device, requires_grad=True)
    out, mean, rstd = torch.ops.fastreduce.layer_norm(x, [n], w, b, 1e-5)
    try:
        theirs = F.layer_norm(x, [n], w, b, 1e-5)
    except RuntimeError:  # torch's CUDA kernels take mixed dtypes under autocast only (torch 2.11)
        theirs = F.layer_norm(x.float(), [n], w, b, 1e-5).to(dtype)
    assert out.dtype == theirs.dtype == dtype and mean.dtype == rstd.dtype == torch.float32
    reference = F.layer_norm(x.double(), [n], w.double(), b.double())
    assert_error_within_torch(out, theirs, reference, 2e-2)
    g = torch.randn(9, n, device=device).to(dtype)
    ours_grads = torch.autograd.grad(out, (x, w, b), g)
    theirs_grads = torch.autograd.grad(theirs, (x, w, b), g)
    for a, t in zip(ours_grads, theirs_grads):
        assert a.dtype == t.dtype
        torch.testing.assert_close(a.float(), t.float(), rtol=5e-2, atol=5e-2 * t.abs().max().item())


class TinyTransformerBlock(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width, bias=False)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))
        self.causal_softmax = None

    def forward(self, x):
        q, k, v = self.qkv(self.ln_1(x)).chunk(3, -1)
        scores = q @ k.transpose(-1, -2)
        if self.causal_softmax is None:
            upper = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
            att = torch.softmax((scores * 0.125).masked_fill(upper, float("-inf")), -1)
        else:
            att = self.causal_softmax(scores, 0.125)
        x = x + self.proj(att @ v)
        return x + self.mlp(self.ln_2(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_patched_model_trains_under_autocast(device, dtype):
    torch.manual_seed(2)
    model = TinyTransformerBlock().to(device)
    patched = copy.deepcopy(model)
    assert fr.patch(patched) == 2
    patched.causal_softmax = fr.causal_softmax
    x = torch.randn(2, 24, 64, device=device)
    losses = []
    for m in (model, patched):
        scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
        with torch.autocast(device, dtype=dtype):
            loss = m(x).float().square().mean()
        scaler.scale(loss).backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=2e-2)
    for (name, p), q in zip(model.named_parameters(), patched.parameters()):
        scale = p.grad.abs().max().item()
        torch.testing.assert_close(q.grad, p.grad, rtol=5e-2, atol=5e-2 * scale, msg=name)


# ---- compiled backward


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_prod_backward_with_zeros(device):
    x = torch.randn(5, 7, device=device)
    x[1, 2] = 0
    x[3, 1] = x[3, 4] = 0
    for dim in (1, 0, None):
        torch._dynamo.reset()  # a closure int that changes between compiles would be made symbolic

        def f(t):
            return fr.prod(t, dim).square().sum()

        leaf = x.clone().requires_grad_()
        grad = torch.autograd.grad(torch.compile(f, fullgraph=True)(leaf), leaf)[0]
        reference = x.clone().requires_grad_()
        product = reference.prod(dim) if dim is not None else reference.prod()
        expected = torch.autograd.grad(product.square().sum(), reference)[0]
        torch.testing.assert_close(grad, expected)
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_backward_of_every_op(device):
    torch._dynamo.reset()
    x = torch.randn(6, 10, device=device, requires_grad=True)
    w = torch.randn(10, device=device, requires_grad=True)
    s = torch.randn(2, 5, 5, device=device, requires_grad=True)

    def ours(x, w, s):
        return (fr.sum(x, 1).sum() + fr.mean(x, 0).sum() + fr.amax(x, 1).sum() + fr.amin(x, 0).sum()
                + fr.prod(x[:, :3], 1).sum() + (fr.layer_norm(x, 10, w) * fr.softmax(x, 0)).sum()
                + (fr.causal_softmax(s, 0.5) * s).sum())

    def theirs(x, w, s):
        upper = torch.ones(5, 5, dtype=torch.bool, device=s.device).triu(1)
        return (x.sum(1).sum() + x.mean(0).sum() + x.amax(1).sum() + x.amin(0).sum()
                + x[:, :3].prod(1).sum() + (F.layer_norm(x, [10], w) * torch.softmax(x, 0)).sum()
                + (torch.softmax((0.5 * s).masked_fill(upper, float("-inf")), -1) * s).sum())

    expected = torch.autograd.grad(theirs(x, w, s), (x, w, s))
    for dynamic in (False, True):
        compiled = torch.compile(ours, fullgraph=True, dynamic=dynamic)
        for a, e in zip(torch.autograd.grad(compiled(x, w, s), (x, w, s)), expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()


# ---- the C++ autograd


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_calls_record_nothing(device):
    x = torch.randn(4, 8, device=device)
    assert fr.sum(x, 1).grad_fn is None and fr.layer_norm(x, 8).grad_fn is None
    x.requires_grad_()
    with torch.no_grad():
        assert fr.softmax(x, 1).grad_fn is None
    assert fr.sum(x, 1).grad_fn is not None and fr.causal_softmax(x[:, :4].reshape(1, 4, 4)).grad_fn is not None
    out, mean, rstd = torch.ops.fastreduce.layer_norm(x, [8], None, None, 1e-5)
    assert out.requires_grad and not mean.requires_grad and not rstd.requires_grad


def differentiable_calls(device):
    """Each differentiable op once, as (name, inputs that require grad, call)."""
    def tensor(*shape):
        return torch.randn(*shape, device=device, requires_grad=True)

    target = torch.tensor([1, 0, 3, 2], device=device)
    return [
        ("sum", [tensor(4, 8)], lambda x: fr.sum(x, 1)),
        ("mean", [tensor(4, 8)], lambda x: fr.mean(x, 0)),
        ("prod", [tensor(4, 8)], lambda x: fr.prod(x, 1)),
        ("amax", [tensor(4, 8)], lambda x: fr.amax(x, 1)),
        ("amin", [tensor(4, 8)], lambda x: fr.amin(x, 1)),
        ("layer_norm", [tensor(4, 8), tensor(8), tensor(8)], lambda x, w, b: fr.layer_norm(x, 8, w, b)),
        ("rms_norm", [tensor(4, 8), tensor(8)], lambda x, w: fr.rms_norm(x, 8, w)),
        ("add_layer_norm", [tensor(4, 8), tensor(4, 8), tensor(8)],
         lambda x, r, w: fr.add_layer_norm(x, r, 8, w)),
        ("add_rms_norm", [tensor(4, 8), tensor(4, 8), tensor(8)], lambda x, r, w: fr.add_rms_norm(x, r, 8, w)),
        ("cross_entropy", [tensor(4, 8)], lambda x: fr.cross_entropy(x, target)),
        ("softmax", [tensor(4, 8)], lambda x: fr.softmax(x, 1)),
        ("causal_softmax", [tensor(2, 4, 4)], lambda s: fr.causal_softmax(s, 0.5)),
        ("var", [tensor(4, 8)], lambda x: fr.var(x, 1)),
        ("std", [tensor(4, 8)], lambda x: fr.std(x, 1)),
        ("var_mean", [tensor(4, 8)], lambda x: fr.var_mean(x, 1)),
        ("std_mean", [tensor(4, 8)], lambda x: fr.std_mean(x, 1)),
        ("logsumexp", [tensor(4, 8)], lambda x: fr.logsumexp(x, 1)),
        ("norm", [tensor(4, 8)], lambda x: fr.norm(x, 2, 1)),
        ("aminmax", [tensor(4, 8)], lambda x: fr.aminmax(x, dim=1)),
    ]


def as_tuple(outputs):
    return outputs if isinstance(outputs, tuple) else (outputs,)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_nodes_name_their_op_and_free_what_they_saved(device):
    # torch keeps a tensor's Python object alive while C++ holds the tensor,
    # so a node that outlived its outputs (a cycle through a saved output)
    # would keep these weak references alive. Each case comes from a fresh
    # list, so no list holds the tensors of the case being checked.
    cases = len(differentiable_calls(device))
    for case in range(cases):
        name, inputs, call = differentiable_calls(device)[case]
        outputs = as_tuple(call(*inputs))
        grad_fn = outputs[0].grad_fn
        assert grad_fn is not None and name.replace("_", "") in grad_fn.name().lower(), (name, grad_fn.name())
        assert sum(edge[0] is not None for edge in grad_fn.next_functions) == len(inputs), name
        refs = [weakref.ref(t) for t in (*inputs, *outputs)]
        del inputs, outputs, grad_fn
        gc.collect()
        assert all(ref() is None for ref in refs), name


@pytest.mark.parametrize("device", DEVICES)
def test_backward_twice_and_dual_tensors_raise(device):
    for name, inputs, call in differentiable_calls(device):
        if name in ("sum", "mean"):  # save no tensors: a second backward is fine, as torch's
            continue
        loss = sum(t.sum() for t in as_tuple(call(*inputs)) if t.requires_grad)
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
    x = torch.randn(4, 8, device=device)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            fr.softmax(dual, 1)


class AtenLog(TorchDispatchMode):
    """The ops dispatched while it is on."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
def test_one_output_of_a_fused_norm_reaches_backward(device):
    # The unused output's gradient acts as zeros, as torch.autograd.Function
    # gives; an unused sum h is not materialised (no fill, nothing more read).
    x, r, w = (torch.randn(*shape, device=device, dtype=torch.float64, requires_grad=True)
               for shape in ((6, 16), (6, 16), (16,)))
    for op, reference in ((fr.add_layer_norm, lambda h: F.layer_norm(h, (16,), w)),
                          (fr.add_rms_norm, lambda h: F.rms_norm(h, (16,), w))):
        for used in (0, 1):
            ours = op(x, r, 16, w)[used].sin().sum()
            h = x + r
            theirs = (reference(h) if used == 0 else h).sin().sum()
            with AtenLog() as log:
                grads = torch.autograd.grad(ours, (x, r, w), allow_unused=True)
            if used == 0:
                assert not [name for name in log.ops if "zero" in name or "fill" in name], log.ops
            for a, e in zip(grads, torch.autograd.grad(theirs, (x, r, w), allow_unused=True)):
                torch.testing.assert_close(a if e is not None else None, e)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_fused_norm_with_one_output_used(device):
    # The fused adds' nodes take undefined gradients for unused outputs;
    # torch.compile's traced backward gives the same gradients as eager.
    x, r, w = (torch.randn(*shape, device=device, requires_grad=True) for shape in ((6, 16), (6, 16), (16,)))
    for op in (fr.add_layer_norm, fr.add_rms_norm):
        for used in ((0,), (1,), (0, 1)):
            def loss(x, r, w):
                outputs = op(x, r, 16, w)
                return sum(outputs[i].sin().sum() for i in used)

            expected = torch.autograd.grad(loss(x, r, w), (x, r, w), allow_unused=True)
            torch._dynamo.reset()
            got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(x, r, w), (x, r, w), allow_unused=True)
            for a, e in zip(got, expected):
                torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_autograd_traces_the_backward_nodes(device):
    for name, inputs, call in differentiable_calls(device):
        torch._dynamo.reset()
        def loss_of(*tensors):
            return sum((t.float() ** 2).sum() for t in as_tuple(call(*tensors)) if t.requires_grad)

        expected = torch.autograd.grad(loss_of(*inputs), inputs)
        for t in inputs:
            t.grad = None

        @torch.compile
        def step(*tensors):
            loss_of(*tensors).backward()

        with torch._dynamo.compiled_autograd._enable(torch.compile(backend="eager")):
            step(*inputs)
        for t, e in zip(inputs, expected):
            torch.testing.assert_close(t.grad, e, msg=name)
    torch._dynamo.reset()
