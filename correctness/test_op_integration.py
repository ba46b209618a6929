"""The op as PyTorch sees it: opcheck, torch.compile through it, and the compile backend's
promise not to recompile per batch size."""

from __future__ import annotations

import pytest
import torch

import glai_kernels


def _inputs(device, requires_grad=True, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(4, 5), (4, 3), (2, 5, 3)] + ([(2,)] if bias else [])
    tensors = [torch.randn(*s, generator=gen).to(device) for s in shapes]
    return [t.requires_grad_(requires_grad) for t in tensors] + ([] if bias else [None])


@pytest.mark.parametrize("save", [False, True], ids=["plain", "saving"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_opcheck_forward(backend_device, save, bias):
    name, device = backend_device
    x, act, weight, b = _inputs(device, bias=bias)
    torch.library.opcheck(torch.ops.glai.estimator.default, (x, act, weight, b, name, save))


def test_opcheck_backward(backend_device):
    name, device = backend_device
    x, act, weight, _ = _inputs(device, requires_grad=False)
    dy = torch.randn(4, 2, device=device)
    for needs in ([True, True, True], [False, True, False], [True, False, True]):
        torch.library.opcheck(torch.ops.glai.estimator_backward.default,
                              (dy, x, act, weight, x.new_empty(0), needs, name))


def test_compile_fullgraph_through_the_op(backend_device):
    name, device = backend_device
    x, act, weight, b = _inputs(device)

    def loss(x, act, weight, b):
        return glai_kernels.estimator(x, act, weight, b, backend=name).square().sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    expected = loss(x, act, weight, b)
    expected_grads = torch.autograd.grad(expected, (x, act, weight, b))
    got = compiled(x, act, weight, b)
    got_grads = torch.autograd.grad(got, (x, act, weight, b))
    torch.testing.assert_close(got, expected)
    for g, e in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e)


def test_inductor_compiles_a_training_step():
    """Inductor (not only aot_eager) takes the op in a module's training step."""
    torch._dynamo.reset()
    module = glai_kernels.GLAIEstimator(5, 3, 2, backend="torch")
    gen = torch.Generator().manual_seed(1)
    x, act = torch.randn(4, 5, generator=gen), torch.randn(4, 3, generator=gen)

    def step(x, act):
        return module(x, act).square().mean()

    expected = torch.autograd.grad(step(x, act), list(module.parameters()))
    got = torch.autograd.grad(torch.compile(step, fullgraph=True)(x, act),
                              list(module.parameters()))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_compile_backend_does_not_recompile_per_batch():
    from torch._dynamo.utils import counters

    # batch sizes distinct from I, P and O: dynamo gives equal sizes one symbol ("duck
    # sizing"), so a batch equal to another dimension is a graph of its own
    weight = torch.randn(2, 5, 4, requires_grad=True)
    glai_kernels.estimator(torch.randn(3, 5), torch.randn(3, 4), weight,
                           backend="compile").sum().backward()
    frames_before = counters["stats"]["unique_graphs"]
    for batch in (6, 9, 17, 33):
        y = glai_kernels.estimator(torch.randn(batch, 5), torch.randn(batch, 4), weight,
                                   backend="compile")
        y.sum().backward()
    assert counters["stats"]["unique_graphs"] == frames_before


class _FillRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """The shapes of every tensor a zero-fill op produced while active."""

    FILLS = frozenset({torch.ops.aten.zeros.default, torch.ops.aten.zeros_like.default,
             torch.ops.aten.fill_.Scalar, torch.ops.aten.zero_.default,
             torch.ops.aten.new_zeros.default})

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.FILLS and isinstance(out, torch.Tensor):
            self.shapes.append(tuple(out.shape))
        return out


def _saved_and_fills(op: str) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """(the shape of the op's saved state, the shapes every zero fill produced during its
    backward), through the registered custom op's autograd."""
    from glai_kernels.sparse import SPARSE_ESTIMATOR, from_dense

    x, act, weight, bias = _inputs("cpu")
    if op == "dense":
        y, saved = torch.ops.glai.estimator(x, act, weight, bias, "torch", True)
        wrt = [x, act, weight]
    else:
        if SPARSE_ESTIMATOR.get("cpp").unsupported_reason("cpu", torch.float32):
            pytest.skip("the sparse cpp backend (it keeps Zg) is unavailable here")
        sw = from_dense(weight.detach(), torch.ones(weight.shape, dtype=torch.bool))
        values = sw.values.detach().requires_grad_(True)
        y, saved = torch.ops.glai.sparse_estimator(x, act, values, list(sw.index), bias,
                                                   "cpp", True)
        wrt = [x, act, values]
    assert saved.numel() > 0  # the backward has a saved state to be handed a gradient for
    recorder = _FillRecorder()
    with recorder:
        torch.autograd.grad(y.sum(), wrt)
    return tuple(saved.shape), recorder.shapes


@pytest.mark.parametrize("op", ["dense", "sparse"])
def test_the_backward_gets_no_zero_filled_gradient_for_the_saved_state(op):
    """The forward's second output (Z [B, O, P], or the sparse Zg) is for the backward alone:
    autograd must not hand the backward a zero-filled gradient for it (a 42 MB fill per step
    at B1; docs/notes/cpu-kernels.md, "Two threads without waiting ...")."""
    saved_shape, fills = _saved_and_fills(op)
    assert saved_shape not in fills, fills
