"""The sparse op on x without its constant-1 last input (`run_resolved(..., ones=True)`, as a
GLAI head calls it): the same y and gradients as on x with a column of ones appended, bit for
bit, whether the `cpp` eager node supplies the ones (glai_ext::sparse_forward_ones: x^T built
with a row of ones and kept for glai_ext::sparse_backward_xt) or the call pads x (every other
route); and the two CPU ops' own checks."""

from __future__ import annotations

import pytest
import torch
from glai_models import random_mlp
from sparse_checker import sparse_problem

from glai_kernels import extension
from glai_kernels.glai import from_mlp, prune
from glai_kernels.sparse import SPARSE_ESTIMATOR
from glai_kernels.sparse import op as sparse_op
from glai_kernels.sparse.layout import KeptIndex
from glai_kernels.sparse.weight import SparsePathWeight

pytestmark = pytest.mark.skipif(
    SPARSE_ESTIMATOR.get("cpp").unsupported_reason("cpu", torch.float32) is not None,
    reason="the sparse cpp backend is unavailable here")


def _case(batch: int, dtype: torch.dtype, seed: int = 3):
    """x [B, I] whose last column is the constant 1, act, a SparsePathWeight, bias, dy."""
    x, act, values, index, dy = sparse_problem(batch, 21, 17, 6, mu=0.4, dtype=dtype, seed=seed)
    x[:, -1] = 1
    bias = torch.randn(6, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return x, act, SparsePathWeight(values.clone(), KeptIndex(*index)), bias, dy


def _run(x, act, sw, bias, dy, ones: bool, backend: str, x_grad: bool, act_grad: bool):
    """y and the gradients (values, bias, x, act) of one call, on fresh leaves."""
    sw.values.grad = None
    bias = bias.clone().requires_grad_()
    x = (x[:, :-1] if ones else x).clone().requires_grad_(x_grad)
    act = act.clone().requires_grad_(act_grad)
    y = sparse_op.run_resolved(x, act, sw, bias, None, backend, ones=ones)
    y.backward(dy)
    return [y.detach(), sw.values.grad, bias.grad, x.grad, act.grad]


@pytest.mark.parametrize("backend", ["cpp", "torch"])
@pytest.mark.parametrize("grads", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["values", "x", "act", "all"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("batch", [1, 16, 17, 33])
def test_ones_is_the_padded_call(batch, dtype, grads, backend):
    x, act, sw, bias, dy = _case(batch, dtype)
    for _ in range(2):  # the first call checks the index in full, the second is remembered
        padded = _run(x, act, sw, bias, dy, False, backend, *grads)
        supplied = _run(x, act, sw, bias, dy, True, backend, *grads)
        for a, b in zip(padded, supplied, strict=True):
            if a is None:
                assert b is None
            else:
                assert b is not None and torch.equal(a[:, :-1] if a.shape == x.shape else a, b)


def test_the_cpp_node_supplies_the_ones(monkeypatch):
    x, act, sw, bias, _ = _case(16, torch.float32)
    sw.values.requires_grad_()
    seen = []
    run = extension.run_sparse_eager
    monkeypatch.setattr(extension, "run_sparse_eager",
                        lambda *a, **k: seen.append(a[-1] if len(a) > 7 else k) or run(*a, **k))
    for _ in range(2):
        sparse_op.run_resolved(x[:, :-1], act, sw, bias, None, "cpp", ones=True)
    assert seen[-1] is True  # the remembered call: the node's own ones


def test_a_head_trains_the_same_with_the_ones_supplied():
    mlp = random_mlp((13, 12, 5), seed=3, dtype=torch.float32)
    head = prune(from_mlp(mlp), torch.randn(64, 13), keep=150, layout="sparse").head
    head.backend = "cpp"
    x = torch.randn(17, 13, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        y = head(x)
        y.square().sum().backward()
        ones = [p.grad.clone() for p in head.parameters() if p.requires_grad]
        head.zero_grad()
        x_aug = torch.constant_pad_nd(x, (0, 1), 1.0)
        z = sparse_op.run_resolved(x_aug, head.selector(x), head.sparse_weight, head.bias, None,
                                   "cpp")
        z.square().sum().backward()
        padded = [p.grad.clone() for p in head.parameters() if p.requires_grad]
        head.zero_grad()
        assert torch.equal(y, z)
        assert all(torch.equal(a, b) for a, b in zip(ones, padded, strict=True))


def test_gradients_of_gradients_with_the_ones_supplied():
    x, act, sw, bias, dy = _case(7, torch.float64)
    grads = []
    for ones in (False, True):
        xs = (x[:, :-1] if ones else x).clone().requires_grad_()
        a = act.clone().requires_grad_()
        for _ in range(2):
            y = sparse_op.run_resolved(xs, a, sw, bias, None, "cpp", ones=ones)
        gx, ga = torch.autograd.grad((y * dy).sum(), (xs, a), create_graph=True)
        gx = gx[:, :x.shape[1] - 1]  # the padded call's ones column has a gradient too
        gg = torch.autograd.grad(gx.square().sum() + ga.square().sum(), a)[0]
        grads.append((gx, ga, gg))
    for u, v in zip(*grads, strict=True):
        assert torch.equal(u, v)


def test_the_ops_check_their_arguments():
    x, act, sw, _, dy = _case(5, torch.float32)
    index = list(sw.index)
    with pytest.raises(RuntimeError, match=r"x must be \[B, I - 1\]"):
        torch.ops.glai_ext.sparse_forward_ones(x, act, sw.values, index, False)
    y, _, xt = torch.ops.glai_ext.sparse_forward_ones(x[:, :-1], act, sw.values, index, False)
    assert torch.equal(y, torch.ops.glai_ext.sparse_forward(x, act, sw.values, index, False)[0])
    assert xt.shape == (x.shape[1], 16)
    assert torch.equal(xt[-1], torch.tensor([1.0] * 5 + [0.0] * 11))
    assert torch.equal(xt[:-1, :5], x[:, :-1].t())
    with pytest.raises(RuntimeError, match="xt must be the forward's"):
        torch.ops.glai_ext.sparse_backward_xt(dy, x[:, :-1], xt[:-1], act, sw.values, index,
                                              torch.empty(0), [False, False, True])
