"""The oracles checked against each other: Listing 1, the float64 formulas, the loops."""

from __future__ import annotations

import math

import pytest
import torch

from glai_kernels.contract import SUPPORTED_DTYPES
from reference import (
    TOLERANCE,
    abs_forward64,
    forward64,
    grads64,
    listing1_backward,
    listing1_forward,
    loops_backward,
    loops_forward,
    make_inputs,
    worst_error,
)
from reference.verdict import judge

SHAPES = [(1, 1, 1, 1), (3, 4, 5, 2), (5, 2, 7, 3)]


@pytest.mark.parametrize("gates", ["binary", "soft"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_loops_agree_with_formulas(shape, gates):
    x, act, weight, bias = make_inputs(*shape, dtype=torch.float64, seed=7, gates=gates)
    torch.testing.assert_close(loops_forward(x, act, weight) + bias,
                               forward64(x, act, weight, bias), rtol=1e-13, atol=1e-13)
    dy = torch.randn(shape[0], shape[3], dtype=torch.float64)
    expected = grads64(dy, x, act, weight)
    for got, want in zip(loops_backward(dy, x, act, weight), expected[:3], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_listing1_autograd_matches_its_written_out_backward(shape):
    x, act, weight, bias = make_inputs(*shape, dtype=torch.float64, seed=8, gates="soft")
    leaves = [t.clone().requires_grad_() for t in (x, act, weight)]
    y = listing1_forward(*leaves, bias)
    dy = torch.randn_like(y)
    autograd = torch.autograd.grad(y, leaves, dy)
    written = listing1_backward(dy, x, act, weight)
    for a, w in zip(autograd, written, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(y, forward64(x, act, weight, bias), rtol=1e-13, atol=1e-13)


def test_listing1_backward_computes_only_what_is_needed():
    x, act, weight, _ = make_inputs(2, 3, 4, 5, dtype=torch.float64)
    dy = torch.randn(2, 5, dtype=torch.float64)
    dx, dact, dweight = listing1_backward(dy, x, act, weight, (False, True, False))
    assert dx is None and dweight is None and dact is not None


def test_worst_error_is_relative_to_the_absolute_sum():
    expected = torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
    scale = torch.tensor([10.0, 4.0, 0.0], dtype=torch.float64)
    actual = torch.tensor([1.5, -2.0, 0.0], dtype=torch.float32)
    assert worst_error(actual, expected, scale) == pytest.approx(0.05)


def test_error_where_no_terms_exist_is_infinite():
    zero = torch.zeros(2, dtype=torch.float64)
    assert math.isinf(worst_error(torch.tensor([0.0, 1e-30]), zero, zero))
    assert math.isinf(worst_error(torch.tensor([float("nan"), 0.0]), zero + 1, zero + 1))


def test_abs_scale_bounds_the_value():
    x, act, weight, bias = make_inputs(6, 5, 4, 3, dtype=torch.float64, gates="soft")
    assert torch.all(forward64(x, act, weight, bias).abs() <= abs_forward64(x, act, weight, bias))


def test_inputs_are_seeded_and_never_zero():
    a = make_inputs(4, 5, 6, 3, seed=11)
    b = make_inputs(4, 5, 6, 3, seed=11)
    c = make_inputs(4, 5, 6, 3, seed=12)
    for t, u in zip(a, b, strict=True):
        assert torch.equal(t, u)
    assert not torch.equal(a.x, c.x)
    assert torch.count_nonzero(a.x) == a.x.numel()
    assert set(a.act.unique().tolist()) == {0.0, 1.0}


def test_every_supported_dtype_has_one_tolerance():
    """The tolerance table covers the contract's dtype list, and nothing else."""
    assert set(TOLERANCE) == set(SUPPORTED_DTYPES)


def test_the_verdict_checks_presence_shape_and_dtype():
    expected = torch.ones(2, 3, dtype=torch.float64)
    good = judge(expected.float(), expected, expected, torch.float32)
    assert good.ok and good.reason == "" and good.ratio == 0.0
    for actual, reason in ((None, "missing"), (torch.ones(3, 2), "shape"),
                           (expected.half(), "dtype torch.float16, expected torch.float32")):
        verdict = judge(actual, expected, expected, torch.float32)
        assert not verdict.ok and verdict.error == math.inf and verdict.reason.startswith(reason)
