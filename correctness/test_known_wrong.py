"""The checker rejects wrong kernels, through the registry as well as called directly."""

from __future__ import annotations

import pytest
import torch
from checker import check
from known_wrong import KNOWN_WRONG, accumulates_in_half

import glai_kernels
from glai_kernels import registry
from reference import listing1_forward


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("name", KNOWN_WRONG)
def test_checker_rejects(name, dtype):
    fn, quantity = KNOWN_WRONG[name]
    failures = check(fn, 6, 5, 4, 3, dtype=dtype, seed=9)
    assert any(f.quantity == quantity for f in failures), failures


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
def test_checker_accepts_the_oracle(dtype):
    assert check(listing1_forward, 6, 5, 4, 3, dtype=dtype, seed=9) == []


def test_checker_rejects_half_accumulation_at_long_sums():
    failures = check(accumulates_in_half, 4, 64, 64, 2, dtype=torch.float16, seed=10,
                     grads=(), positive=True)
    assert [f.quantity for f in failures] == ["y"]
    # the same sums are short enough to pass at small K: the failure is the accumulator's
    assert check(accumulates_in_half, 4, 2, 3, 2, dtype=torch.float16, seed=10, grads=(),
                 positive=True) == []


def test_checker_rejects_a_wrong_output_dtype():
    """Right values in the wrong dtype (float32 from bfloat16 inputs) are wrong."""
    def widened(x, act, weight, bias):
        return listing1_forward(x.float(), act.float(), weight.float(), bias.float())

    failures = check(widened, 6, 5, 4, 3, dtype=torch.bfloat16, seed=9, grads=())
    assert [f.quantity for f in failures] == ["y (dtype torch.float32, expected torch.bfloat16)"]


def test_checker_rejects_a_wrong_registered_backend():
    def forward(x, act, weight):  # forgets that act gates the paths
        return torch.einsum("bi,ois->bo", x, weight)

    def backward(dy, x, act, weight, needs):
        return (None, None, None)

    registry.register(registry.Backend(name="wrong_forward", forward=forward, backward=backward,
                                       devices=("cpu",), description="wrong on purpose"))
    try:
        failures = check(lambda x, a, w, b: glai_kernels.estimator(x, a, w, b,
                                                                   backend="wrong_forward"),
                         5, 4, 3, 2, seed=11)
    finally:
        registry.unregister("wrong_forward")
    assert failures[0].quantity == "y"
    assert failures[1].quantity.startswith("backward raised RuntimeError: backend "
                                           "'wrong_forward' returned nothing for dx")


def test_checker_catches_a_backend_that_modifies_its_input():
    def forward(x, act, weight):
        result = torch.einsum("bi,bs,ois->bo", x, act, weight)
        x.mul_(2)  # the op hands contiguous inputs straight through: this is the caller's x
        return result

    registry.register(registry.Backend(name="mutating", forward=forward,
                                       backward=lambda *a: (None, None, None),
                                       devices=("cpu",), description="mutates on purpose"))
    try:
        failures = check(lambda x, a, w, b: glai_kernels.estimator(x, a, w, b, backend="mutating"),
                         3, 4, 2, 2, seed=12, grads=())
    finally:
        registry.unregister("mutating")
    assert [f.quantity for f in failures] == ["input x was modified"]


def test_a_memoised_draw_is_out_of_reach_of_a_backend_that_modifies_it():
    """check(memo=True) hands each call clones of the kept draw: a backend that writes into
    its inputs is caught, and the next check of the same draw still judges the correct
    backend right, with the oracle of the values as drawn."""
    def mutating(x, act, weight, bias):
        y = glai_kernels.estimator(x, act, weight, bias, backend="einsum")
        with torch.no_grad():  # as a kernel writing through its pointers would
            x.mul_(2)
            weight.add_(1)
        return y

    def einsum(x, act, weight, bias):
        return glai_kernels.estimator(x, act, weight, bias, backend="einsum")

    first = check(mutating, 3, 5, 4, 2, seed=13, grads=(), memo=True)
    assert [f.quantity for f in first] == ["input x was modified", "input weight was modified"]
    assert check(einsum, 3, 5, 4, 2, seed=13, memo=True) == []
    assert check(einsum, 3, 5, 4, 2, seed=13, memo=True) == []  # the kept gradients' oracle

    def wrong_dx(x, act, weight, bias):  # the right y, dx off by 0.5 everywhere
        return einsum(x, act, weight, bias) + 0.5 * (x - x.detach()).sum(1, keepdim=True)

    assert [f.quantity for f in check(wrong_dx, 3, 5, 4, 2, seed=13, memo=True)] == ["dx"]
