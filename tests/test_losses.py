"""cross_entropy against float64 references and torch, forward and backward,
every option: reductions, ignore_index, label smoothing, the lse output, the
gradient computed in the forward and written over the logits."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import fastreduce_torch as fr
from conftest import DEVICES, close_to_reference, offset_view, requires_cuda

LOW = [torch.float32, torch.float16, torch.bfloat16]


def ce_reference(logits, target, ignore_index, reduction, smoothing):
    return F.cross_entropy(logits.double(), target, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=smoothing)


def gradients_against_float64(out, x, logits, target, ignore_index, reduction, smoothing, return_lse):
    """Checks the loss (and lse) of ``out`` against float64 cross-entropy of
    ``logits``, then returns the gradient at ``x`` and the float64 one at
    ``logits`` for the same random incoming gradient."""
    loss = out[0] if return_lse else out
    x64 = logits.double().requires_grad_(True)
    ref = ce_reference(x64, target, ignore_index, reduction, smoothing)
    close_to_reference(loss, ref.detach(), scale=1.0)
    if return_lse:
        close_to_reference(out[1].to(x.dtype), torch.logsumexp(x64.detach(), 1), scale=1.0)
    g = torch.rand_like(ref) + 0.5
    (grad,) = torch.autograd.grad(loss, x, g.to(x.dtype))
    (ref_grad,) = torch.autograd.grad(ref, x64, g)
    return grad, ref_grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("shape", [(1, 7), (13, 33), (64, 1000), (5, 50304)])
@pytest.mark.parametrize("return_lse", [True, False])  # False: the gradient comes from the forward
def test_cross_entropy_every_option(device, dtype, shape, return_lse):
    n, v = shape
    logits = (torch.randn(n, v, device=device) * 3).to(dtype)
    target = torch.randint(0, v, (n,), device=device)
    for reduction, smoothing, ignore_index in itertools.product(["mean", "sum", "none"], [0.0, 0.1], [-100, 3]):
        if n > 2:
            target[1] = ignore_index
            target[n // 2] = 3  # ignored too with ignore_index 3
        x = logits.clone().requires_grad_(True)
        out = fr.cross_entropy(x, target, ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=smoothing, return_lse=return_lse)
        loss = out[0] if return_lse else out
        assert loss.dtype == dtype and loss.shape == ((n,) if reduction == "none" else ())
        grad, ref_grad = gradients_against_float64(out, x, logits, target, ignore_index, reduction, smoothing,
                                                   return_lse)
        close_to_reference(grad, ref_grad, scale=ref_grad.abs().max().item() + 1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("return_lse", [True, False])
def test_cross_entropy_target_at_every_place(device, dtype, return_lse):
    # Targets at each place of a 16-byte pack (row r's at r * 41, so r mod 8),
    # the first and last class: the gradient's -1 lands on the target alone.
    n, v = 26, 1000
    logits = (torch.randn(n, v, device=device) * 3).to(dtype)
    target = torch.arange(n, device=device) * 41
    target[-2:] = torch.tensor([0, v - 1])
    x = logits.clone().requires_grad_(True)
    out = fr.cross_entropy(x, target, reduction="sum", return_lse=return_lse)
    loss = out[0] if return_lse else out
    x64 = logits.double().requires_grad_(True)
    ref = ce_reference(x64, target, -100, "sum", 0.0)
    (grad,) = torch.autograd.grad(loss, x)
    (ref_grad,) = torch.autograd.grad(ref, x64)
    close_to_reference(grad, ref_grad, scale=1.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("with_lse", [False, True])
def test_cross_entropy_inplace_backward(device, dtype, reduction, smoothing, with_lse):
    # The gradient written over the logits equals the one in a new tensor
    # (lse's gradient included); the logits are overwritten by it.
    hidden = torch.randn(33, 1000, device=device).to(dtype).requires_grad_()
    target = torch.randint(0, 1000, (33,), device=device)
    target[::5] = -100
    g = torch.rand(33 if reduction == "none" else (), device=device).to(dtype) + 0.5

    def grads(inplace):
        logits = hidden * 1  # a non-leaf, as a model's
        loss, lse = fr.cross_entropy(logits, target, reduction=reduction, label_smoothing=smoothing, return_lse=True,
                                     inplace_backward=inplace)
        total = (loss * g).sum() + (lse.pow(2).sum() * 1e-2 if with_lse else 0)
        (grad,) = torch.autograd.grad(total, hidden)
        return loss.detach(), grad, logits.detach()

    loss, grad, logits = grads(False)
    loss_inplace, grad_inplace, overwritten = grads(True)
    torch.testing.assert_close(loss_inplace, loss)
    torch.testing.assert_close(grad_inplace, grad)
    torch.testing.assert_close(overwritten, grad)  # hidden * 1: the logits' gradient is hidden's


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inplace", [False, True])
def test_cross_entropy_gradient_in_forward(device, inplace):
    # The gradient computed in the forward: scaled by the incoming gradient
    # (1 or not), once only; under autocast in float32, as torch's loss.
    logits = torch.randn(9, 300, device=device)
    target = torch.randint(0, 300, (9,), device=device)
    for g in (1.0, -2.5):
        x = logits.clone().requires_grad_()
        loss = fr.cross_entropy(x * 1, target, inplace_backward=inplace)
        loss.backward(torch.tensor(g, device=device), retain_graph=True)
        x_ref = logits.clone().requires_grad_()
        (F.cross_entropy(x_ref, target) * g).backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
        with pytest.raises(RuntimeError, match="second backward"):
            loss.backward()
    dtype = torch.bfloat16
    with torch.autocast(device, dtype=dtype):
        x = logits.to(dtype).requires_grad_()
        loss = fr.cross_entropy(x, target, inplace_backward=inplace)
        assert loss.dtype == F.cross_entropy(x, target).dtype == torch.float32
    loss.backward()
    x_ref = logits.to(dtype).requires_grad_()
    with torch.autocast(device, dtype=dtype):
        F.cross_entropy(x_ref, target).backward()
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad, x_ref.grad)


@requires_cuda
@pytest.mark.cuda
def test_cross_entropy_gradient_in_forward_holds_no_more_memory():
    # Between forward and backward autograd holds the gradient instead of
    # the logits: with the logits dropped, no more than before.
    hidden = torch.randn(512, 64, device="cuda", requires_grad=True)
    head = torch.randn(50304, 64, device="cuda") / 8
    target = torch.randint(0, 50304, (512,), device="cuda")

    def held(**options):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        loss = fr.cross_entropy(hidden @ head.T, target, **options)
        torch.cuda.synchronize()
        return loss, torch.cuda.memory_allocated() - before

    logits_bytes = 512 * 50304 * 4
    held(return_lse=True)  # the first matmul allocates cuBLAS's workspace
    for options in ({}, {"inplace_backward": True}):
        loss, extra = held(**options)
        assert extra <= logits_bytes + 2**20, (options, extra)
        loss.backward()
    loss, extra = held(return_lse=True)  # the gradient comes in the backward: the logits are held
    assert logits_bytes <= extra <= logits_bytes + 2**20


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("shape, dtype", [((3000, 5000), torch.bfloat16), ((300, 80000), torch.float32),
                                          ((100, 262144), torch.bfloat16), ((40, 262144), torch.float32)],
                         ids=["bfloat16-3000x5000", "float32-300x80000", "bfloat16-100x262144", "float32-40x262144"])
@pytest.mark.parametrize("inplace", [False, True])
def test_cross_entropy_gradient_in_forward_rows_in_turn(shape, dtype, inplace):
    # More rows than blocks, so that each block reads its next row while it
    # writes the gradient of the current one: rows that fit an SM several
    # times, rows of which one block keeps 3/4 on chip and reads the rest
    # again from L2, and rows split over a cluster of blocks (16 of 512 at
    # 262144 floats). Loss and
    # gradient against torch's, smoothing included (no float64 reference:
    # gpu_check.sh's racecheck runs this test, and torch's float64 sum trips
    # racecheck).
    logits = torch.randn(shape, device="cuda").to(dtype) * 3
    target = torch.randint(0, shape[1], (shape[0],), device="cuda")
    target[::11] = -100
    for smoothing in (0.0, 0.1):
        x, x_ref = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        loss = fr.cross_entropy(x * 1, target, label_smoothing=smoothing, inplace_backward=inplace)
        loss_ref = F.cross_entropy(x_ref, target, label_smoothing=smoothing)
        loss.backward()
        loss_ref.backward()
        torch.testing.assert_close(loss, loss_ref)
        torch.testing.assert_close(x.grad, x_ref.grad)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("shape, dtype", [((37, 262144), torch.bfloat16), ((3, 240008), torch.bfloat16),
                                          ((300, 131072), torch.float32), ((300, 50304), torch.bfloat16),
                                          ((200, 128256), torch.bfloat16), ((64, 151936), torch.bfloat16),
                                          ((40, 262144), torch.float32), ((9, 256001), torch.float32),
                                          ((9, 524288), torch.bfloat16), ((300, 12000), torch.float32),
                                          ((3, 300000), torch.float32), ((60, 100000), torch.bfloat16),
                                          ((700, 20000), torch.float16), ((300, 40000), torch.bfloat16),
                                          ((300, 45000), torch.bfloat16)],
                         ids=["bfloat16-37x262144", "bfloat16-3x240008", "float32-300x131072", "bfloat16-300x50304",
                              "bfloat16-200x128256", "bfloat16-64x151936", "float32-40x262144", "float32-9x256001",
                              "bfloat16-9x524288", "float32-300x12000", "float32-3x300000", "bfloat16-60x100000",
                              "float16-700x20000", "bfloat16-300x40000", "bfloat16-300x45000"])
@pytest.mark.parametrize("inplace", [False, True])
def test_cross_entropy_gradient_in_forward_rows_split_over_clusters(shape, dtype, inplace):
    # Rows past 32 KiB run over a cluster of blocks (here of 8 or 16, of 64
    # to 512 threads, 5 or 8 packs a thread: 5 in 8 blocks of 64, 128 and
    # 160 at 20000, 40000 and 45000 two-byte; rows past 16 blocks of 256 in 16
    # of 512, 256001 loose; the rows the walk leaves, 12000 and 300000
    # floats, split through shared memory), each holding its share: shares that
    # do not divide the row (240008), fewer rows than clusters and more,
    # targets spread over the shares and at both ends, every reduction,
    # smoothing and ignored rows, against float64.
    n, v = shape
    logits = (torch.randn(shape, device="cuda") * 3).to(dtype)
    target = torch.randint(0, v, (n,), device="cuda")
    target[0], target[-1] = 0, v - 1
    if n > 3:
        target[1::7] = -100
    for reduction, smoothing in itertools.product(["mean", "sum", "none"], [0.0, 0.1]):
        x = logits.clone().requires_grad_(True)
        loss = fr.cross_entropy(x * 1, target, reduction=reduction, label_smoothing=smoothing,
                                inplace_backward=inplace)
        x64 = logits.double().requires_grad_(True)
        ref = ce_reference(x64, target, -100, reduction, smoothing)
        close_to_reference(loss, ref.detach(), scale=1.0)
        g = torch.rand_like(ref) + 0.5
        loss.backward(g.to(dtype))
        (ref_grad,) = torch.autograd.grad(ref, x64, g)
        close_to_reference(x.grad, ref_grad, scale=ref_grad.abs().max().item() + 1e-3)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("shape, dtype", [((16, 50304), torch.bfloat16), ((16, 50257), torch.bfloat16),
                                          ((16, 40000), torch.float32), ((16, 200000), torch.float32)],
                         ids=["bfloat16-16x50304", "bfloat16-16x50257", "float32-16x40000", "float32-16x200000"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("inplace", [False, True])
def test_cross_entropy_gradient_in_forward_wide_rows_against_their_first(shape, dtype, reduction, smoothing,
                                                                         inplace):
    # Wide rows (a cluster's) take their exponentials against their first
    # logit, and the rows that it cannot shift again against their largest:
    # a first logit far below the rest or far above, huge logits tied and
    # spread, logits past 2^24, +inf, NaN, rows of -inf with one finite
    # logit or none, a first logit of -inf. Loss and gradient against
    # float64, NaN where torch's are, rows of both kinds in one launch.
    n, v = shape
    gen = torch.Generator(device="cuda").manual_seed(7)
    logits = torch.randn(shape, device="cuda", generator=gen) * 3
    logits[1, 0] = -100.0
    logits[2, 0] = 100.0
    logits[3] = 3e4
    logits[4] = logits[4] * 300 + 5e5
    logits[5] = logits[5] * 1e7
    logits[6, 777] = float("inf")
    logits[7, 123] = float("nan")
    logits[8] = float("-inf")
    logits[8, 5] = 0.5
    logits[9] = float("-inf")
    logits[10, 0] = float("-inf")
    logits = logits.to(dtype)
    target = torch.randint(0, v, (n,), device="cuda", generator=gen)
    target[:4] = torch.tensor([0, 0, 0, v - 1])
    target[8], target[11], target[12] = 5, -100, v - 1
    x = logits.clone().requires_grad_(True)
    loss = fr.cross_entropy(x * 1, target, reduction=reduction, label_smoothing=smoothing, inplace_backward=inplace)
    x64 = logits.double().requires_grad_(True)
    ref = F.cross_entropy(x64, target, reduction=reduction, label_smoothing=smoothing)
    rtol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(loss.double(), ref.detach(), equal_nan=True, rtol=rtol, atol=rtol)
    g = torch.rand_like(ref) + 0.5
    loss.backward(g.to(dtype))
    (ref_grad,) = torch.autograd.grad(ref, x64, g)
    assert torch.equal(x.grad.isnan(), ref_grad.isnan())
    finite = ~ref_grad.isnan()
    close_to_reference(x.grad[finite], ref_grad[finite], scale=ref_grad[finite].abs().max().item() + 1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("classes, pitch", [(53, 64), (1000, 1003)])
@pytest.mark.parametrize("return_lse", [True, False])
def test_cross_entropy_view_of_wider_rows(device, dtype, classes, pitch, return_lse):
    # logits[:, :classes] of a padded vocabulary (llm.c's 50257 of 50304):
    # rows read where they are, aligned or not; the gradient has the view's shape.
    n = 29
    wide = (torch.randn(n, pitch, device=device) * 3).to(dtype)
    target = torch.randint(0, classes, (n,), device=device)
    target[:3] = torch.tensor([0, classes - 1, -100])
    for reduction, smoothing in itertools.product(["mean", "sum", "none"], [0.0, 0.1]):
        x = wide.clone().requires_grad_(True)
        out = fr.cross_entropy(x[:, :classes], target, reduction=reduction, label_smoothing=smoothing,
                               return_lse=return_lse)
        grad, ref_grad = gradients_against_float64(out, x, wide[:, :classes], target, -100, reduction, smoothing,
                                                   return_lse)
        close_to_reference(grad[:, :classes], ref_grad, scale=ref_grad.abs().max().item() + 1e-3)
        assert not grad[:, classes:].any()


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("shape, dtype", [((3000, 5001), torch.bfloat16), ((64, 50265), torch.float16),
                                          ((300, 50257), torch.bfloat16), ((100, 128257), torch.bfloat16),
                                          ((300, 80001), torch.float32), ((32, 151937), torch.bfloat16)],
                         ids=["bfloat16-3000x5001", "float16-64x50265", "bfloat16-300x50257", "bfloat16-100x128257",
                              "float32-300x80001", "bfloat16-32x151937"])
@pytest.mark.parametrize("offset", [0, 3])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("return_lse", [False, True])  # False: the gradient comes from the forward
def test_cross_entropy_odd_vocabularies(shape, dtype, offset, inplace, return_lse):
    # Rows that are not whole 16-byte packs (GPT-2's and BART's vocabularies)
    # start at every place of a pack, and at storage offset 3 none starts on
    # one: each row's packs from its first 16-byte boundary, its loose classes
    # around them. Targets on loose classes at both ends and inside the packs;
    # rows in turn on one block, rows split over a cluster; every
    # reduction, smoothing and ignored rows, against float64.
    n, v = shape
    logits = (torch.randn(shape, device="cuda") * 3).to(dtype)
    target = torch.randint(0, v, (n,), device="cuda")
    target[:8] = torch.tensor([0, 1, 5, 7, v - 1, v - 3, v - 8, v // 2])
    target[9::7] = -100
    for reduction, smoothing in itertools.product(["mean", "sum", "none"], [0.0, 0.1]):
        x = offset_view(logits, offset).requires_grad_(True)
        # In place, over a copy of x (aligned: a leaf's storage is not overwritten).
        out = fr.cross_entropy(x * 1 if inplace else x, target, reduction=reduction, label_smoothing=smoothing,
                               inplace_backward=inplace, return_lse=return_lse)
        grad, ref_grad = gradients_against_float64(out, x, logits, target, -100, reduction, smoothing, return_lse)
        close_to_reference(grad, ref_grad, scale=ref_grad.abs().max().item() + 1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("incoming", [float("inf"), float("-inf"), float("nan"), -2.5])
@pytest.mark.parametrize("counted", ["some", "none"])
def test_ignored_rows_under_any_incoming_gradient(device, dtype, reduction, smoothing, inplace, incoming, counted):
    # torch's backward never scales an ignored row: it stays 0 whatever the
    # incoming gradient, where the gradient computed in the forward times
    # inf would be NaN. The counted rows are as finite as torch's (its and
    # ours differ in which non-finite value a class gets).
    logits = torch.randn(7, 45, device=device).to(dtype)
    target = torch.randint(0, 45, (7,), device=device)
    target[::3] = -100
    if counted == "none":
        target[:] = -100
    x, leaf = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    loss = fr.cross_entropy(x * 1, target, reduction=reduction, label_smoothing=smoothing, inplace_backward=inplace)
    expected = F.cross_entropy(leaf, target, reduction=reduction, label_smoothing=smoothing)
    g = torch.full_like(expected, incoming)
    loss.backward(g.to(loss.dtype))
    expected.backward(g)
    ignored = target == -100
    assert torch.equal(x.grad[ignored], leaf.grad[ignored])
    assert torch.equal(x.grad.isfinite(), leaf.grad.isfinite())
    if incoming == -2.5:  # bf16: ours rounds twice (the gradient, then its scale)
        tol = {} if dtype == torch.float32 else {"rtol": 2**-6, "atol": 2**-7 * leaf.grad.abs().max().item()}
        torch.testing.assert_close(x.grad, leaf.grad, **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("rows, width", [(37, 1), (37, 3), (37, 8), (37, 13), (37, 4096), (200003, 13)])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("factor", [3.0, float("inf"), 1.0])
def test_scale_unless_one_by_targets(device, dtype, rows, width, offset, factor):
    # Random data (not a loss's 0 rows): an ignored row is left as it is
    # (per_row), and all of it when every target is ignored. Widths that are
    # not a whole number of packs (pack straddling two rows), and rows past
    # one grid-stride step.
    # Bitwise, NaN equal to NaN: torch 2.11's CPU randn gives bfloat16 zeros,
    # and 0 * inf is NaN in both.
    def same(got, want):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)

    scale = torch.ops.fastreduce._scale_unless_one_
    x = offset_view(torch.randn(rows, width, device=device, dtype=dtype), offset)
    target = torch.randint(0, 5, (rows,), device=device)
    target[1::4] = 3
    f = torch.tensor(factor, device=device)
    scaled = x.double().mul(factor).to(dtype) if factor != 1 else x
    got = x.clone()
    scale(got, f, target, 3, True)
    same(got, torch.where((target != 3).unsqueeze(1), scaled, x))
    for ignored, want in ((target, scaled), (torch.full_like(target, 3), x)):
        got = x.clone()
        scale(got, f, ignored, 3)
        same(got, want)
    with pytest.raises(RuntimeError, match="'target'"):
        scale(x.clone(), f, target[1:], 3, True)
    with pytest.raises(RuntimeError, match="'per_row'"):
        scale(x.clone(), f, None, 3, True)
    with pytest.raises(RuntimeError, match="'target'"):
        scale(x.clone(), f, target.int(), 3)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_edges(device):
    logits = torch.randn(6, 40, device=device)
    ignored = torch.full((6,), -100, device=device)
    assert torch.isnan(fr.cross_entropy(logits, ignored))  # all ignored: 0/0, as torch
    assert fr.cross_entropy(logits, ignored, reduction="sum").item() == 0
    x = logits.clone().requires_grad_(True)
    fr.cross_entropy(x, ignored, reduction="sum").backward()
    assert (x.grad == 0).all()
    # A masked vocabulary (-inf logits) stays finite; an inf logit gives NaN, as torch.
    masked = logits.clone()
    masked[:, 30:] = float("-inf")
    target = torch.randint(0, 30, (6,), device=device)
    torch.testing.assert_close(fr.cross_entropy(masked, target), F.cross_entropy(masked, target))
    hot = logits.clone()
    hot[0, 0] = float("inf")
    assert torch.isnan(fr.cross_entropy(hot, target)) and torch.isnan(F.cross_entropy(hot, target))
    empty = torch.randn(0, 40, device=device)
    assert torch.isnan(fr.cross_entropy(empty, torch.zeros(0, dtype=torch.long, device=device)))
    # Non-contiguous and offset logits.
    wide = torch.randn(40, 6, device=device).t()
    torch.testing.assert_close(fr.cross_entropy(wide, target), F.cross_entropy(wide, target))
    shifted = offset_view(torch.randn(6, 64, device=device), 3)
    torch.testing.assert_close(fr.cross_entropy(shifted, target), F.cross_entropy(shifted, target))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("inplace", [False, True])
def test_ignored_rows_with_non_finite_logits(device, reduction, inplace):
    # An ignored row's gradient is 0 times its softmax, as torch's: NaN in
    # rows holding NaN or +inf or only -inf, 0 elsewhere, whether the
    # gradient comes from the forward (mean, sum) or a separate backward.
    logits = torch.randn(5, 40, device=device)
    logits[1, 7] = float("nan")
    logits[2, 3] = float("inf")
    logits[3] = float("-inf")
    logits[4, 20:] = float("-inf")
    target = torch.tensor([2, -100, -100, -100, -100], device=device)
    x, leaf = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    loss = fr.cross_entropy(x * 1, target, reduction=reduction, inplace_backward=inplace)
    expected = F.cross_entropy(leaf, target, reduction=reduction)
    torch.testing.assert_close(loss, expected, equal_nan=True)
    g = torch.rand_like(expected) + 0.5
    loss.backward(g)
    expected.backward(g)
    assert torch.equal(x.grad.isnan(), leaf.grad.isnan())
    torch.testing.assert_close(x.grad, leaf.grad, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("return_lse", [True, False])  # False: the gradient comes from the forward
def test_nan_logits_among_masked_ones(device, dtype, reduction, return_lse):
    # A NaN logit makes its row's lse, loss and gradient NaN, as torch's,
    # wherever it falls: beside a finite logit or far from it in a row of
    # -inf (where a thread's part holds only the NaN and -inf), in a row of
    # NaN and -inf alone, beside +inf; rows without NaN stay as torch's.
    v = 5003
    logits = torch.full((6, v), float("-inf"), device=device)
    logits[0, 11], logits[0, 4000] = float("nan"), 1.5
    logits[1, 4000], logits[1, 11] = float("nan"), 1.5
    logits[2, 2500] = float("nan")
    logits[3, 7], logits[3, 9] = float("nan"), float("inf")
    logits[4, 100:] = torch.randn(v - 100, device=device)
    logits[5, 3000] = 2.0
    logits = logits.to(dtype)
    target = torch.tensor([4000, 11, 0, 9, 200, 3000], device=device)
    x, leaf = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    out = fr.cross_entropy(x * 1, target, reduction=reduction, return_lse=return_lse)
    loss = out[0] if return_lse else out
    expected = F.cross_entropy(leaf.float(), target, reduction=reduction)
    torch.testing.assert_close(loss.float(), expected, equal_nan=True, atol=1e-2, rtol=1e-2)
    if return_lse:
        expected_lse = torch.logsumexp(logits.double(), 1)
        assert torch.equal(out[1].isnan(), expected_lse.isnan())
        torch.testing.assert_close(out[1].double(), expected_lse, equal_nan=True, atol=1e-2, rtol=1e-2)
    g = torch.rand_like(expected) + 0.5
    loss.backward(g.to(dtype))
    expected.backward(g)
    assert torch.equal(x.grad.isnan(), leaf.grad.isnan())
    torch.testing.assert_close(x.grad.float(), leaf.grad.float(), equal_nan=True, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_gradient_in_forward_edges(device, reduction):
    # The loss that the forward with the gradient reduces in its own launch
    # (its last block folds the blocks' sums): every row ignored (a mean is
    # 0/0 = NaN, as torch), no rows, and more rows than blocks (5000 short
    # rows: some blocks take two). Loss and gradient against torch's.
    many = torch.randint(0, 24, (5000,), device=device)
    many[::7] = -100
    cases = [(torch.randn(6, 40, device=device), torch.full((6,), -100, device=device)),
             (torch.randn(0, 40, device=device), torch.zeros(0, dtype=torch.long, device=device)),
             (torch.randn(5000, 24, device=device) * 3, many)]
    for logits, target in cases:
        x, x_ref = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        loss = fr.cross_entropy(x, target, reduction=reduction)
        loss_ref = F.cross_entropy(x_ref, target, reduction=reduction)
        torch.testing.assert_close(loss, loss_ref, equal_nan=True)
        loss.backward(torch.tensor(1.5, device=device))
        loss_ref.backward(torch.tensor(1.5, device=device))
        torch.testing.assert_close(x.grad, x_ref.grad, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("return_lse", [True, False])  # False: the gradient comes from the forward
def test_cross_entropy_one_class_gradient_is_zero(device, dtype, reduction, smoothing, return_lse):
    # One class: the target is the whole row, so torch's gradient is exactly
    # 0 whatever the incoming gradient's size; an ulp of it left over would
    # be huge for huge gradients.
    logits = (torch.randn(9, 1, device=device) * 1e30).to(dtype)
    target = torch.zeros(9, dtype=torch.long, device=device)
    target[2] = -100
    grad_out = torch.randn(9 if reduction == "none" else (), device=device) * 3e30
    x, x_ref = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    out = fr.cross_entropy(x, target, reduction=reduction, label_smoothing=smoothing, return_lse=return_lse)
    loss = out[0] if return_lse else out
    loss_ref = F.cross_entropy(x_ref, target, reduction=reduction, label_smoothing=smoothing)
    loss.backward(grad_out.to(dtype))
    loss_ref.backward(grad_out.to(dtype))
    assert torch.equal(x_ref.grad, torch.zeros_like(x_ref.grad))
    assert torch.equal(x.grad, x_ref.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("return_lse", [True, False])  # False: the gradient comes from the forward
def test_cross_entropy_full_smoothing_gradient(device, return_lse):
    # label_smoothing 1: the target is like any other class, its share g (1 -
    # eps) exactly 0. Equal logits: every gradient is 0 up to the rounding of
    # soft * p - g / classes, far below an ulp of g at the target.
    logits = torch.zeros(6, 1000, device=device)
    target = torch.arange(6, device=device) * 101
    x = logits.clone().requires_grad_()
    out = fr.cross_entropy(x, target, reduction="sum", label_smoothing=1.0, return_lse=return_lse)
    (out[0] if return_lse else out).backward()
    x64 = logits.double().requires_grad_()
    ce_reference(x64, target, -100, "sum", 1.0).backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=0, atol=1e-9)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_z_loss_gradient(device):
    logits = torch.randn(8, 100, device=device, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 100, (8,), device=device)
    target[2] = -100

    def ours(x):
        loss, lse = fr.cross_entropy(x, target, label_smoothing=0.05, return_lse=True)
        return loss + 1e-2 * lse.pow(2).mean()

    def theirs(x):
        return F.cross_entropy(x, target, label_smoothing=0.05) + 1e-2 * torch.logsumexp(x, 1).pow(2).mean()

    torch.testing.assert_close(torch.autograd.grad(ours(logits), logits)[0],
                               torch.autograd.grad(theirs(logits), logits)[0])
    only_lse = torch.autograd.grad(fr.cross_entropy(logits, target, return_lse=True)[1].sum(), logits)[0]
    torch.testing.assert_close(only_lse, torch.softmax(logits, 1))


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_bad_arguments(device):
    logits = torch.randn(4, 10, device=device)
    target = torch.randint(0, 10, (4,), device=device)
    with pytest.raises(RuntimeError, match="'target'"):
        fr.cross_entropy(logits, target.int())
    with pytest.raises(RuntimeError, match="'target'"):
        fr.cross_entropy(logits, target[:3])
    with pytest.raises(RuntimeError, match="'input'"):
        fr.cross_entropy(logits.view(2, 2, 10), target)
    with pytest.raises(RuntimeError, match="'reduction'"):
        fr.cross_entropy(logits, target, reduction="avg")
    with pytest.raises(RuntimeError, match="'residual'"):
        fr.add_rms_norm(logits, logits[:, :5], 10)
    with pytest.raises(RuntimeError, match="'residual'"):
        fr.add_rms_norm(logits, logits.int(), 10)
    with pytest.raises(RuntimeError, match="'weight'"):
        fr.rms_norm(logits, 10, torch.randn(9, device=device))


def test_cross_entropy_target_out_of_range_cpu():
    with pytest.raises(RuntimeError, match="outside"):
        fr.cross_entropy(torch.randn(3, 5), torch.tensor([0, 5, 1]))


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_gradcheck(device):
    logits = torch.randn(5, 7, dtype=torch.float64, device=device, requires_grad=True)
    target = torch.tensor([0, 6, -100, 3, 3], device=device)
    for reduction in ("mean", "sum", "none"):
        assert torch.autograd.gradcheck(
            lambda x: fr.cross_entropy(x, target, reduction=reduction, label_smoothing=0.2, return_lse=True),
            (logits,))


def samples(device):
    x = torch.randn(4, 24, device=device, requires_grad=True)
    target = torch.tensor([1, -100, 23, 0], device=device)
    zero_ignored = torch.tensor([1, 0, 23, 0], device=device)
    ops = torch.ops.fastreduce
    return [
        (ops.cross_entropy.default, (x, target, "mean", -100, 0.1), {}),
        (ops.cross_entropy.default, (x, zero_ignored, "none", 0, 0.0), {}),
        (ops._cross_entropy_with_grad.default, (x.detach(), target, "mean", -100, 0.1), {}),
        (ops._cross_entropy_with_grad_.default, (x.detach().clone(), target, "sum", -100, 0.0), {}),
        (ops._scale_unless_one_.default, (x.detach().clone(), torch.tensor(2.0, device=device)), {}),
        (ops._scale_unless_one_.default, (x.detach().clone(), torch.tensor(2.0, device=device), target), {}),
        (ops._scale_unless_one_.default, (x.detach().clone(), torch.tensor(2.0, device=device), target, -100, True),
         {}),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args, kwargs in samples(device):
        torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cross_entropy_autocast_output_dtype(device, dtype):
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("CPU autocast is bfloat16")
    x = torch.randn(4, 16, device=device)
    target = torch.randint(0, 16, (4,), device=device)
    with torch.autocast(device, dtype=dtype):
        cases = [(fr.cross_entropy(x.to(dtype), target), F.cross_entropy(x.to(dtype), target)),
                 (fr.cross_entropy(x, target), F.cross_entropy(x, target))]
    for ours, theirs in cases:
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)
