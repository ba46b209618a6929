"""Seeded random inputs for the op, shared by the correctness suite and the benchmarks.

Never zeros: x and weight are standard normal (weight scaled by 1/sqrt(I*P) to keep y of
order 1); act is the selector's 0/1 pattern (each path active with probability 1/2) or, for
soft gates, standard normal too.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

Gates = Literal["binary", "soft"]


class Inputs(NamedTuple):
    """x [B, I], act [B, P], weight [O, I, P], bias [O] or None."""

    x: torch.Tensor
    act: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None


def make_inputs(
    batch: int,
    inputs: int,
    paths: int,
    outputs: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    gates: Gates = "binary",
    bias: bool = True,
    positive: bool = False,
) -> Inputs:
    """Draw one call's inputs from a generator seeded with `seed` (on the CPU, then moved,
    so a seed gives the same values on every device).

    `positive` takes absolute values: no term cancels another, so every output is as large
    as its error scale and an accumulator too narrow for the sum shows at once.
    """
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = normal(batch, inputs)
    if gates == "binary":
        act = (torch.rand(batch, paths, generator=gen, dtype=torch.float64) < 0.5).double()
    else:
        act = normal(batch, paths)
    weight = normal(outputs, inputs, paths) / (inputs * paths) ** 0.5
    b = normal(outputs) if bias else None
    if positive:
        x, act, weight = x.abs(), act.abs(), weight.abs()
        b = None if b is None else b.abs()
    move = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return Inputs(move(x), move(act), move(weight), move(b))
