"""The oracles checked against each other: Listing 1, the float64 formulas, the loops."""

from __future__ import annotations

import importlib
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


def _whole_tensor_worst_error(actual, expected64, scale64) -> float:
    """worst_error's definition over the whole tensor at once (its form before stop 55)."""
    err = (actual.to(torch.float64) - expected64).abs()
    has_terms = scale64 > 0
    ratio = torch.where(has_terms, err / torch.where(has_terms, scale64, 1.0),
                        torch.where(err > 0, torch.inf, 0.0))
    return float(torch.nan_to_num(ratio, nan=torch.inf, posinf=torch.inf).max())


EDGE_VALUES = [0.0, 1.0, -1.0, 1e-300, math.inf, -math.inf, math.nan]
EDGE_SCALES = [0.0, 2.0, math.inf, math.nan]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64],
                         ids=["f32", "bf16", "f64"])
def test_worst_error_in_steps_is_the_whole_tensor_definition(monkeypatch, dtype):
    """Steps of 5 elements over 3 x 31 (non-contiguous, a transposed view): every pairing of
    an edge value (0, 1, tiny, ±inf, NaN) with an expected value and a scale (0, 2, inf, NaN),
    put at a seeded position among ordinary elements, gives the whole-tensor result, as do
    the ordinary elements alone and steps where every scale is positive."""
    monkeypatch.setattr(importlib.import_module("reference.tolerance"), "WORST_ERROR_CHUNK", 5)
    g = torch.Generator().manual_seed(55)
    expected = torch.randn(31, 3, generator=g, dtype=torch.float64)
    scale = expected.abs() + torch.rand(31, 3, generator=g, dtype=torch.float64)
    base = (expected + 1e-3 * torch.randn(31, 3, generator=g, dtype=torch.float64)).to(dtype)
    actual = base.t()  # non-contiguous
    cases = [(actual, expected.t(), scale.t())]
    for a, e, s in [(a, e, s) for a in EDGE_VALUES for e in EDGE_VALUES for s in EDGE_SCALES]:
        at = int(torch.randint(93, (1,), generator=g))
        one_a, one_e, one_s = base.clone(), expected.clone(), scale.clone()
        one_a.view(-1)[at], one_e.view(-1)[at], one_s.view(-1)[at] = a, e, s
        cases.append((one_a.t(), one_e.t(), one_s.t()))
    for a, e, s in cases:
        assert not a.is_contiguous()
        got, want = worst_error(a, e, s), _whole_tensor_worst_error(a, e, s)
        assert got == want or (math.isnan(got) and math.isnan(want)), (a, e, s, got, want)
    assert 0 < worst_error(*cases[0]) < math.inf


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
