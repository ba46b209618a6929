"""The sparse `cpp` backend's eager autograd node in C++ (csrc/cpu/sparse_eager_autograd.cpp,
`Backend.eager` through glai_kernels/calls.py's `record`): what `sparse.estimator` records for
plain tensors that need gradients in eager mode.

- it gives the custom op's output and gradients (dx, dact, dvalues, dbias) bit for bit, for
  float32, float64 and bfloat16, every subset of gradients (act's decides whether the group sums
  are kept), with and without bias, on strided inputs, and leaves its inputs as they were;
- a backward that builds a graph gives the custom op's gradients of gradients; gradcheck and
  gradgradcheck pass through it in float64;
- as autograd's own nodes: an input modified in place after the forward fails the backward; the
  saved tensors are freed after a backward without retain_graph;
- an empty problem (B = 0) takes the op's Python Function, not the node;
- the ordinary training step of a sparse GLAIHead on `cpp` records this node.
"""

from __future__ import annotations

import pytest
import torch
from sparse_checker import sparse_problem

import glai_kernels.sparse as sparse
from glai_kernels.sparse import SPARSE_ESTIMATOR
from glai_kernels.sparse.layout import KeptIndex
from glai_kernels.sparse.op import sparse_estimator_op
from glai_kernels.sparse.weight import SparsePathWeight

NODE = "glai::SparseEstimatorBackward"

pytestmark = pytest.mark.skipif(
    SPARSE_ESTIMATOR.get("cpp").unsupported_reason("cpu", torch.float32) is not None,
    reason="the sparse cpp backend is unavailable here")


def _weight(index: list[torch.Tensor], values: torch.Tensor) -> SparsePathWeight:
    """A SparsePathWeight on `index` whose values are a fresh leaf (a copy of `values`)."""
    return SparsePathWeight(values.detach().clone(), KeptIndex(*index))


def _problem(dtype: torch.dtype, seed: int, shape=(13, 29, 19, 7), mu=0.3):
    x, act, values, index, dy = sparse_problem(*shape, mu=mu, dtype=dtype, seed=seed)
    bias = torch.randn(shape[3], generator=torch.Generator().manual_seed(seed + 9)).to(dtype)
    return x, act, values, index, dy, bias


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("wanted", [(0,), (1,), (2,), (0, 1, 2, 3)],
                         ids=["x", "act", "values", "all"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
def test_node_is_the_op(dtype, wanted, with_bias, strided):
    """The node's y and gradients equal the custom op's (its torch.library autograd) bit for
    bit, and the inputs are left unchanged."""
    x, act, values, index, dy, bias = _problem(dtype, seed=5)
    if strided:  # the same values through transposed storage
        x = x.t().contiguous().t()
        act = act.t().contiguous().t()
        assert not x.is_contiguous() and not act.is_contiguous()
    before = [t.clone() for t in (x, act, values)]

    def run(through_op: bool) -> list[torch.Tensor]:
        sw = _weight(index, values)
        leaves = [x.detach().requires_grad_(0 in wanted), act.detach().requires_grad_(
            1 in wanted), sw.values.requires_grad_(2 in wanted)]
        b = bias.detach().requires_grad_(3 in wanted) if with_bias else None
        if through_op:
            y = sparse_estimator_op(*leaves, list(sw.index), b, "cpp", leaves[1].requires_grad)[0]
        else:
            y = sparse.estimator(*leaves[:2], sw, b, backend="cpp")
            assert y.grad_fn.name() == NODE
        asked = [t for t in (*leaves, b) if t is not None and t.requires_grad]
        return [y, *torch.autograd.grad(y, asked, dy)]

    for node, op in zip(run(False), run(True), strict=True):
        assert node.dtype == op.dtype and torch.equal(node, op)
    assert all(torch.equal(t, b) for t, b in zip((x, act, values), before, strict=True))


def test_node_gradients_of_gradients_are_the_op():
    """create_graph through the node calls the sparse backward op: the same first and second
    gradients as the custom op's own autograd."""
    x, act, values, index, dy, bias = _problem(torch.float64, seed=7)

    def run(through_op: bool) -> list[torch.Tensor]:
        sw = _weight(index, values)
        leaves = [x.clone().requires_grad_(), act.clone().requires_grad_(),
                  sw.values.requires_grad_(), bias.clone().requires_grad_()]
        if through_op:
            y = sparse_estimator_op(*leaves[:3], list(sw.index), leaves[3], "cpp", True)[0]
        else:
            y = sparse.estimator(*leaves[:2], sw, leaves[3], backend="cpp")
            assert y.grad_fn.name() == NODE
        grads = torch.autograd.grad(y, leaves, dy, create_graph=True)
        penalty = grads[0].square().sum() + (grads[2] * grads[1].sum()).sum()
        return [*grads, *torch.autograd.grad(penalty, leaves[:3])]

    for node, op in zip(run(False), run(True), strict=True):
        assert torch.equal(node, op)


def test_gradcheck_and_gradgradcheck_through_the_node():
    x, act, values, index, _, bias = _problem(torch.float64, seed=11, shape=(3, 6, 4, 3), mu=0.5)
    sw = _weight(index, values)
    inputs = (x.requires_grad_(), act.requires_grad_(), sw.values.requires_grad_(),
              bias.requires_grad_())
    assert sparse.estimator(*inputs[:2], sw, inputs[3], backend="cpp").grad_fn.name() == NODE

    def f(x, act, _values, bias):
        return sparse.estimator(x, act, sw, bias, backend="cpp")

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def _recorded(seed: int):
    """(x, sw, dy, y): y from the node on a float32 problem whose values alone need a
    gradient."""
    x, act, values, index, dy, _ = _problem(torch.float32, seed=seed)
    sw = _weight(index, values)
    sw.values.requires_grad_()
    return x, sw, dy, sparse.estimator(x, act, sw, backend="cpp")


def test_node_sees_a_saved_input_modified():
    x, sw, dy, y = _recorded(seed=1)
    with torch.no_grad():
        x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y, [sw.values], dy)


def test_node_frees_its_saved_tensors():
    _, sw, dy, y = _recorded(seed=2)
    first = torch.autograd.grad(y, [sw.values], dy, retain_graph=True)[0]
    assert torch.equal(torch.autograd.grad(y, [sw.values], dy)[0], first)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(y, [sw.values], dy)


def test_empty_batch_takes_the_function():
    """B = 0 never reaches the kernels: the op's Python Function answers with zeros."""
    x, act, values, index, _, bias = _problem(torch.float32, seed=3)
    sw = _weight(index, values)
    sw.values.requires_grad_()
    b = bias.requires_grad_()
    y = sparse.estimator(x[:0], act[:0], sw, b, backend="cpp")
    assert y.shape == (0, 7) and y.grad_fn.name() != NODE
    dvalues, dbias = torch.autograd.grad(y.sum(), [sw.values, b])
    assert not dvalues.any() and not dbias.any()


def test_ordinary_glai_step_records_the_node():
    """A sparse GLAIHead's forward on `cpp` in training (the ordinary loop) records the node."""
    from glai_kernels.glai import match, prune
    from glai_kernels.glai.mlp import make_mlp

    torch.manual_seed(0)
    _, head, budget = match(make_mlp((24, 16, 3)), 0.5)
    head = prune(head, torch.randn(32, 24), keep=budget.keep, layout="sparse").head
    head.backend = "cpp"
    y = head(torch.randn(5, 24))
    assert y.grad_fn.name() == NODE
    y.square().mean().backward()
    assert head.sparse_weight.values.grad is not None and head.bias.grad is not None
