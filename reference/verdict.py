"""The one verdict on a backend's output: its shape, its dtype and its error against the float64
oracle under its dtype's tolerance. The correctness suite (`correctness/checker.py`) and the
benchmarks (`bench/oracle.py`) both judge through `judge`, so they cannot disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reference.tolerance import tolerance, worst_error


@dataclass(frozen=True)
class Verdict:
    """How one output compares with the oracle.

    `error` is the worst |actual - expected| / scale (`worst_error`), infinite when the output
    is missing or has the wrong shape or dtype; `reason` says which of those, else "".
    """

    error: float
    tolerance: float
    reason: str = ""

    @property
    def ok(self) -> bool:
        # `not >` would pass a NaN error; `<=` fails it
        return self.error <= self.tolerance

    @property
    def ratio(self) -> float:
        """error / tolerance: at most 1 means correct."""
        return self.error / self.tolerance if self.tolerance > 0 else math.inf


def judge(actual: torch.Tensor | None, expected64: torch.Tensor, scale64: torch.Tensor,
          dtype: torch.dtype, tf32: bool = False) -> Verdict:
    """The verdict on `actual`, which should have `expected64`'s shape and the inputs' `dtype`.

    `expected64` and `scale64` are the float64 oracle's value and its sum of absolute terms
    (`forward64`/`abs_forward64`, `grads64`/`abs_grads64`), of the same shape. `tf32`: float32
    matmuls may have rounded their inputs to TF32, which takes a wider tolerance.
    """
    tol = tolerance(dtype, tf32)
    if actual is None:
        return Verdict(math.inf, tol, "missing")
    if actual.dtype != dtype:
        return Verdict(math.inf, tol, f"dtype {actual.dtype}, expected {dtype}")
    try:
        error = worst_error(actual.detach().cpu(), expected64.cpu(), scale64.cpu())
    except ValueError as e:  # the shapes differ
        return Verdict(math.inf, tol, str(e))
    return Verdict(error, tol)
