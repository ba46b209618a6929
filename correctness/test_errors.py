"""Bad input gets an error that names the argument, what was expected and what came."""

from __future__ import annotations

import re

import pytest
import torch

import glai_kernels


def good(batch=4, inputs=5, paths=3, outputs=2, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(batch, inputs, generator=gen, dtype=dtype),
        "act": torch.randn(batch, paths, generator=gen, dtype=dtype),
        "weight": torch.randn(outputs, inputs, paths, generator=gen, dtype=dtype),
        "bias": torch.randn(outputs, generator=gen, dtype=dtype),
    }


CASES = {
    "x rank": ({"x": torch.randn(4, 5, 1)}, ValueError, r"x must be 2-d \[B, I\].*\[4, 5, 1\]"),
    "act rank": ({"act": torch.randn(12)}, ValueError, r"act must be 2-d \[B, P\].*\[12\]"),
    "weight rank": ({"weight": torch.randn(2, 15)}, ValueError,
                    r"weight must be 3-d \[O, I, P\].*\[2, 15\]"),
    "bias rank": ({"bias": torch.randn(2, 1)}, ValueError, r"bias must be 1-d \[O\]"),
    "x not a tensor": ({"x": [[1.0] * 5] * 4}, TypeError, r"x must be a tensor.*got list"),
    "batch mismatch": ({"act": torch.randn(3, 3)}, ValueError,
                       r"act must have B = 4 rows.*\[3, 3\]"),
    "I mismatch": ({"weight": torch.randn(2, 6, 3)}, ValueError,
                   r"weight \[O, I, P\] must have I = 5.*\[2, 6, 3\]"),
    "P mismatch": ({"weight": torch.randn(2, 5, 4)}, ValueError,
                   r"weight \[O, I, P\] must have P = 3.*\[2, 5, 4\]"),
    "bias size": ({"bias": torch.randn(3)}, ValueError,
                  r"bias must have shape \[O\] = \[2\].*\[3\]"),
    "integer x": ({"x": torch.ones(4, 5, dtype=torch.int64)}, TypeError,
                  r"x must have a floating dtype.*got torch.int64"),
    "act dtype": ({"act": torch.randn(4, 3, dtype=torch.float64)}, TypeError,
                  r"act must have the same dtype as x \(torch.float32\), got torch.float64"),
    "weight dtype": ({"weight": torch.randn(2, 5, 3, dtype=torch.float16)}, TypeError,
                     r"weight must have the same dtype as x.*torch.float16"),
    "bias dtype": ({"bias": torch.randn(2, dtype=torch.bfloat16)}, TypeError,
                   r"bias must have the same dtype as x.*torch.bfloat16"),
    "act device": ({"act": torch.randn(4, 3, device="meta")}, ValueError,
                   r"act must be on the same device as x \(cpu\), got meta"),
}


@pytest.mark.parametrize("change,error,message", CASES.values(), ids=CASES.keys())
def test_bad_argument_is_named(change, error, message):
    args = {**good(), **change}
    with pytest.raises(error, match=message):
        glai_kernels.estimator(args["x"], args["act"], args["weight"], args["bias"])


TENSOR_CASES = {k: v for k, v in CASES.items() if k != "x not a tensor"}  # the schema's own


@pytest.mark.parametrize("change,error,message", TENSOR_CASES.values(), ids=TENSOR_CASES.keys())
def test_direct_op_call_checks_too(change, error, message):
    args = {**good(), **change}
    with pytest.raises(error, match=message):
        torch.ops.glai.estimator(args["x"], args["act"], args["weight"], args["bias"], "torch")


def test_unknown_backend_lists_registered():
    args = good()
    expected = r"unknown estimator backend 'nope'; registered backends: auto, .*einsum.*torch"
    with pytest.raises(ValueError, match=expected):
        glai_kernels.estimator(args["x"], args["act"], args["weight"], backend="nope")


def test_unknown_backend_in_environment(monkeypatch):
    monkeypatch.setenv("GLAI_BACKEND", "tritonn")
    args = good()
    with pytest.raises(ValueError, match=re.escape("unknown estimator backend 'tritonn'")):
        glai_kernels.estimator(args["x"], args["act"], args["weight"])


def test_backend_that_cannot_take_the_dtype():
    from glai_kernels import registry

    def never(*args):
        raise AssertionError("a backend refused for the dtype must not run")

    registry.register(registry.Backend(
        name="only_f64", forward=never, backward=never, devices=("cpu",),
        description="test backend", dtypes=(torch.float64,)))
    try:
        args = good()
        with pytest.raises(RuntimeError, match=r"'only_f64' cannot run torch.float32 on cpu: "
                                               r"supports torch.float64, not torch.float32"):
            glai_kernels.estimator(args["x"], args["act"], args["weight"], backend="only_f64")
    finally:
        registry.unregister("only_f64")


def test_errors_leave_inputs_untouched():
    args = good()
    before = {k: v.clone() for k, v in args.items()}
    with pytest.raises(ValueError):
        glai_kernels.estimator(args["x"], args["act"], args["weight"], args["bias"][:1])
    for key, value in args.items():
        assert torch.equal(value, before[key])
