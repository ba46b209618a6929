"""Every sparse backend against the float64 DENSE oracle on the masked weight: forward and
every gradient (dvalues = the dense dweight at the kept entries), every dtype with the dense
tolerances; gradcheck, opcheck, torch.compile, and errors that name the argument.

Backends come from the sparse registry; `GLAI_BACKEND=name` restricts them to that one (a
name only the dense op has skips these tests)."""

from __future__ import annotations

import os

import pytest
import torch
from backends_under_test import backend_param
from sparse_checker import Case, check_sparse

import glai_kernels.sparse as sparse
from glai_kernels import registry
from glai_kernels.contract import SUPPORTED_DTYPES
from glai_kernels.sparse import SPARSE_ESTIMATOR, from_dense

DTYPES = list(SUPPORTED_DTYPES)
DTYPE_IDS = ["f32", "f64", "f16", "bf16"]


def _params() -> list:
    chosen = os.environ.get(registry.ENV_VAR)
    names = SPARSE_ESTIMATOR.names()
    if chosen and chosen != registry.AUTO:
        if chosen not in names:
            reason = f"${registry.ENV_VAR}={chosen} is not a sparse backend"
            return [pytest.param(("none", "cpu"), marks=pytest.mark.skip(reason=reason))]
        names = [chosen]
    params = []
    for name in names:
        backend = SPARSE_ESTIMATOR.get(name)
        for device in backend.devices:
            params.append(backend_param(name, backend, device))
    return params


@pytest.fixture(params=_params())
def sparse_backend(request) -> tuple[str, str]:
    """(sparse backend name, device) for every available pair."""
    return request.param


CASES = {
    "K0": Case((4, 5, 3, 2), keep=0),
    "K1": Case((3, 4, 5, 6), keep=1),
    "mu1": Case((5, 20, 10, 6), mu=0.01),
    "mu50": Case((6, 9, 7, 5), mu=0.5),
    "mu100": Case((4, 6, 5, 3), mu=1.0),
    "empty-output": Case((5, 8, 6, 4), mu=0.4, empty_output=True),
    "ones": Case((1, 1, 1, 1), mu=1.0),
    "B129": Case((129, 7, 4, 3), mu=0.3),
    "I127-P1": Case((3, 127, 1, 5), mu=0.2),
    "O129": Case((4, 3, 5, 129), mu=0.1),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_dense_oracle(sparse_backend, case, dtype):
    name, device = sparse_backend
    assert not check_sparse(name, device, case, dtype=dtype, seed=sum(case.shape))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_soft_gates(sparse_backend, dtype):
    name, device = sparse_backend
    assert not check_sparse(name, device, Case((9, 11, 13, 6), mu=0.3), dtype=dtype, seed=1,
                            gates="soft")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_non_contiguous_inputs(sparse_backend, dtype):
    name, device = sparse_backend
    assert not check_sparse(name, device, Case((8, 10, 6, 5), mu=0.3), dtype=dtype, seed=2,
                            contiguous=False)


GRAD_SUBSETS = [(), ("x",), ("act",), ("values",), ("bias",), ("x", "values"),
                ("act", "values")]


@pytest.mark.parametrize("grads", GRAD_SUBSETS, ids=lambda g: "+".join(g) or "none")
def test_only_needed_gradients(sparse_backend, grads):
    name, device = sparse_backend
    assert not check_sparse(name, device, Case((6, 5, 4, 3), mu=0.4), seed=3, grads=grads)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_empty_batch(sparse_backend, bias):
    name, device = sparse_backend
    assert not check_sparse(name, device, Case((0, 5, 4, 3), mu=0.5), bias=bias)


def test_gradcheck_float64(sparse_backend):
    name, device = sparse_backend
    gen = torch.Generator().manual_seed(5)
    mask = torch.rand(4, 6, 5, generator=gen) < 0.4
    sw = from_dense(torch.randn(4, 6, 5, generator=gen, dtype=torch.float64), mask).to(device)
    x, act, b = (torch.randn(*s, generator=gen, dtype=torch.float64).to(device).requires_grad_()
                 for s in ((3, 6), (3, 5), (4,)))
    values = sw.values.detach().clone().requires_grad_()
    index = list(sw.index)

    def op(x, act, values, b):  # the op itself, so gradcheck can perturb values
        return torch.ops.glai.sparse_estimator(x, act, values, index, b, name,
                                               act.requires_grad)[0]

    assert torch.autograd.gradcheck(op, (x, act, values, b))


def _op_inputs(device, bias=True):
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(3, 5, 4, generator=gen) < 0.5
    sw = from_dense(torch.randn(3, 5, 4, generator=gen), mask).to(device)
    x = torch.randn(4, 5, generator=gen).to(device)
    act = torch.randn(4, 4, generator=gen).to(device)
    b = torch.randn(3, generator=gen).to(device) if bias else None
    return x, act, sw, b


@pytest.mark.parametrize("save", [False, True], ids=["plain", "saving"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_opcheck_forward(sparse_backend, save, bias):
    name, device = sparse_backend
    x, act, sw, b = _op_inputs(device, bias)
    args = (x.requires_grad_(), act.requires_grad_(), sw.values.detach().requires_grad_(),
            list(sw.index), b, name, save)
    torch.library.opcheck(torch.ops.glai.sparse_estimator.default, args)


def test_opcheck_backward(sparse_backend):
    name, device = sparse_backend
    x, act, sw, _ = _op_inputs(device)
    dy = torch.randn(4, 3, device=device)
    for needs in ([True, True, True], [False, True, False], [True, False, True]):
        torch.library.opcheck(torch.ops.glai.sparse_estimator_backward.default,
                              (dy, x, act, sw.values.detach(), list(sw.index), x.new_empty(0),
                               needs, name))


def test_compile_fullgraph(sparse_backend):
    name, device = sparse_backend
    x, act, sw, b = _op_inputs(device)
    x.requires_grad_()
    act.requires_grad_()
    b.requires_grad_()

    def loss(x, act, b):
        return sparse.estimator(x, act, sw, b, backend=name).square().sum()

    inputs = (x, act, sw.values, b)
    expected = loss(x, act, b)
    expected_grads = torch.autograd.grad(expected, inputs)
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = compiled(x, act, b)
    got_grads = torch.autograd.grad(got, inputs)
    torch.testing.assert_close(got, expected)
    for g, e in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e)


def test_backward_of_a_saving_forward_matches_recomputation(sparse_backend):
    """dact from the kept group sums equals dact recomputed (act requires grad or not)."""
    name, device = sparse_backend
    x, act, sw, _ = _op_inputs(device)
    y, saved = torch.ops.glai.sparse_estimator(x, act, sw.values.detach(), list(sw.index),
                                               None, name, True)
    dy = torch.randn_like(y)
    args = (dy, x, act, sw.values.detach(), list(sw.index))
    with_saved = torch.ops.glai.sparse_estimator_backward(*args, saved, [True, True, True], name)
    without = torch.ops.glai.sparse_estimator_backward(*args, x.new_empty(0), [True, True, True],
                                                       name)
    for a, e in zip(with_saved, without, strict=True):
        torch.testing.assert_close(a, e)


# ---- errors ------------------------------------------------------------------------------

def _good():
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(2, 5, 3, generator=gen) < 0.5
    return {"x": torch.randn(4, 5, generator=gen), "act": torch.randn(4, 3, generator=gen),
            "sw": from_dense(torch.randn(2, 5, 3, generator=gen), mask),
            "bias": torch.randn(2, generator=gen)}


def _sw(shape, dtype=torch.float32):
    return from_dense(torch.randn(shape, dtype=dtype), torch.ones(shape, dtype=torch.bool))


ERRORS = {
    "x rank": ({"x": torch.randn(4, 5, 1)}, ValueError, r"x must be 2-d \[B, I\].*\[4, 5, 1\]"),
    "act rank": ({"act": torch.randn(12)}, ValueError, r"act must be 2-d \[B, P\]"),
    "x not a tensor": ({"x": [[1.0] * 5] * 4}, TypeError, r"x must be a tensor.*got list"),
    "sw not sparse": ({"sw": torch.randn(2, 5, 3)}, TypeError,
                      r"sw must be a SparsePathWeight.*got Tensor"),
    "batch mismatch": ({"act": torch.randn(3, 3)}, ValueError, r"act must have B = 4 rows"),
    "I mismatch": ({"sw": _sw((2, 6, 3))}, ValueError,
                   r"sw \[O, I, P\] must have I = 5 \(x.shape\[1\]\), got sw of shape \[2, 6, 3\]"),
    "P mismatch": ({"sw": _sw((2, 5, 4))}, ValueError, r"sw \[O, I, P\] must have P = 3"),
    "bias size": ({"bias": torch.randn(3)}, ValueError, r"bias must have shape \[O\] = \[2\]"),
    "integer x": ({"x": torch.ones(4, 5, dtype=torch.int64)}, TypeError,
                  r"x must have a floating dtype.*got torch.int64"),
    "act dtype": ({"act": torch.randn(4, 3, dtype=torch.float64)}, TypeError,
                  r"act must have the same dtype as x \(torch.float32\), got torch.float64"),
    "values dtype": ({"sw": _sw((2, 5, 3), torch.float16)}, TypeError,
                     r"sw.values must have the same dtype as x.*torch.float16"),
    "bias dtype": ({"bias": torch.randn(2, dtype=torch.bfloat16)}, TypeError,
                   r"bias must have the same dtype as x.*torch.bfloat16"),
    "act device": ({"act": torch.randn(4, 3, device="meta")}, ValueError,
                   r"act must be on the same device as x \(cpu\), got meta"),
    "values device": ({"sw": _sw((2, 5, 3)).to("meta")}, ValueError,
                      r"sw.values must be on the same device as x \(cpu\), got meta"),
}


@pytest.mark.parametrize("change,error,message", ERRORS.values(), ids=ERRORS.keys())
def test_bad_argument_is_named(change, error, message):
    args = {**_good(), **change}
    with pytest.raises(error, match=message):
        sparse.estimator(args["x"], args["act"], args["sw"], args["bias"])


def test_index_of_wrong_length_is_named():
    args = _good()
    index = list(args["sw"].index)
    index[0] = index[0][:-1]  # inputs [K - 1]
    with pytest.raises(ValueError, match=r"index.inputs must have \d+ entries"):
        torch.ops.glai.sparse_estimator(args["x"], args["act"], args["sw"].values.detach(),
                                        index, None, "torch", False)


def test_backend_selection(monkeypatch):
    args = _good()
    with pytest.raises(ValueError, match=r"unknown sparse_estimator backend 'nope'"):
        sparse.estimator(args["x"], args["act"], args["sw"], backend="nope")
    dense_only = next(n for n in registry.names() if n not in SPARSE_ESTIMATOR.names())
    monkeypatch.setenv(registry.ENV_VAR, dense_only)
    with pytest.raises(ValueError, match=rf"\$GLAI_BACKEND='{dense_only}' names no sparse"):
        sparse.estimator(args["x"], args["act"], args["sw"])
    # an explicit backend= overrides the variable
    sparse.estimator(args["x"], args["act"], args["sw"], backend="torch")
    monkeypatch.setenv(registry.ENV_VAR, "torch")
    sparse.estimator(args["x"], args["act"], args["sw"])
    assert {s.name for s in sparse.backends()} == set(SPARSE_ESTIMATOR.names())
