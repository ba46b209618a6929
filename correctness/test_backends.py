"""Every backend against the float64 oracle: forward and every gradient, every dtype."""

from __future__ import annotations

import pytest
import torch
from checker import Layout, check

import glai_kernels
from glai_kernels.contract import SUPPORTED_DTYPES
from glai_kernels.paper_heads import PAPER_HEADS

DTYPES = SUPPORTED_DTYPES
DTYPE_IDS = [str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES]

# (B, I, P, O): sizes of 1, 7, 127 and 129 in each position, P = 1 and O = 1.
SHAPES = {
    "ones": (1, 1, 1, 1),
    "sevens": (7, 7, 7, 7),
    "B127": (127, 5, 3, 2),
    "B129-I7": (129, 7, 4, 3),
    "I129": (3, 129, 5, 2),
    "P127": (5, 7, 127, 3),
    "O129": (4, 3, 5, 129),
    "P1": (16, 33, 1, 5),
    "O1": (16, 9, 17, 1),
}


def _fn(name: str):
    def run(x, act, weight, bias):
        return glai_kernels.estimator(x, act, weight, bias, backend=name)
    return run


def _assert_passes(failures) -> None:
    assert not failures, "; ".join(str(f) for f in failures)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_matches_oracle(backend_device, shape, dtype):
    name, device = backend_device
    _assert_passes(check(_fn(name), *shape, dtype=dtype, device=device, seed=sum(shape)))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_long_positive_sums_accumulate_wide(backend_device, dtype):
    """All terms positive, K = I*P = 8192: a half-precision accumulator loses whole terms
    here (see known_wrong.accumulates_in_half), float32 accumulation does not."""
    name, device = backend_device
    _assert_passes(check(_fn(name), 3, 128, 64, 2, dtype=dtype, device=device, seed=13,
                         positive=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_soft_gates(backend_device, dtype):
    name, device = backend_device
    _assert_passes(check(_fn(name), 9, 11, 13, 6, dtype=dtype, device=device, seed=1,
                         gates="soft"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_non_contiguous_inputs(backend_device, dtype):
    name, device = backend_device
    _assert_passes(check(_fn(name), 8, 10, 6, 5, dtype=dtype, device=device, seed=2,
                         layout=Layout(contiguous=False)))


GRAD_SUBSETS = [(), ("x",), ("act",), ("weight",), ("bias",), ("x", "weight"),
                ("act", "weight")]


@pytest.mark.parametrize("grads", GRAD_SUBSETS, ids=lambda g: "+".join(g) or "none")
def test_only_needed_gradients(backend_device, grads):
    name, device = backend_device
    _assert_passes(check(_fn(name), 6, 5, 4, 3, device=device, seed=3, grads=grads))


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_empty_batch(backend_device, bias):
    name, device = backend_device
    x = torch.randn(0, 4, device=device, requires_grad=True)
    act = torch.randn(0, 3, device=device, requires_grad=True)
    weight = torch.randn(2, 4, 3, device=device, requires_grad=True)
    b = torch.randn(2, device=device, requires_grad=True) if bias else None
    y = glai_kernels.estimator(x, act, weight, b, backend=name)
    assert y.shape == (0, 2)
    y.sum().backward()
    assert weight.grad is not None and torch.count_nonzero(weight.grad) == 0
    assert x.grad.shape == (0, 4) and act.grad.shape == (0, 3)
    if bias:
        assert b.grad is not None and torch.count_nonzero(b.grad) == 0


@pytest.mark.parametrize("head", PAPER_HEADS.values(), ids=PAPER_HEADS.keys())
def test_paper_heads_small_batch(backend_device, head):
    name, device = backend_device
    shape = head.shape(batch=2)
    _assert_passes(check(_fn(name), shape.batch, shape.inputs, shape.paths, shape.outputs,
                         device=device, seed=4, memo=True))


def test_gradcheck_float64(backend_device):
    name, device = backend_device
    gen = torch.Generator().manual_seed(5)
    args = [torch.randn(*s, generator=gen, dtype=torch.float64).to(device).requires_grad_()
            for s in ((3, 4), (3, 5), (2, 4, 5), (2,))]
    assert torch.autograd.gradcheck(
        lambda x, a, w, b: glai_kernels.estimator(x, a, w, b, backend=name), args)


def test_deterministic_mode_repeats_bitwise(backend_device, deterministic):
    """With deterministic algorithms on, a second call gives the same bits, forward and
    backward (no stale state, no order-dependent reduction)."""
    name, device = backend_device
    gen = torch.Generator().manual_seed(6)
    tensors = [torch.randn(*s, generator=gen).to(device) for s in ((33, 6), (33, 7), (3, 6, 7))]

    def run():
        leaves = [t.clone().requires_grad_() for t in tensors]
        y = glai_kernels.estimator(*leaves, backend=name)
        y.backward(torch.ones_like(y))
        return [y.detach()] + [leaf.grad for leaf in leaves]

    for first, second in zip(run(), run(), strict=True):
        assert torch.equal(first, second)
