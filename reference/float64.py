"""docs/ARCHITECTURE.md §1's formulas, written out and evaluated in float64.

`forward64` and `grads64` are the values every backend is compared with. `abs_forward64` and
`abs_grads64` evaluate the same sums over absolute values: the standard bound on the rounding
error of a sum of products is (a small multiple of) the unit roundoff times that sum, so it is
the scale against which each dtype's tolerance is stated.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Gradients(NamedTuple):
    """dx [B, I], dact [B, P], dweight [O, I, P], dbias [O], all float64."""

    x: torch.Tensor
    act: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor


def _f64(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().to(torch.float64) for t in tensors]


def forward64(
    x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """y[b,o] = sum_i sum_s x[b,i] act[b,s] weight[o,i,s] + bias[o], in float64."""
    x, act, weight = _f64(x, act, weight)
    y = torch.einsum("bi,bs,ois->bo", x, act, weight)
    return y if bias is None else y + bias.detach().to(torch.float64)


def grads64(
    dy: torch.Tensor, x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor
) -> Gradients:
    """The four gradients of docs/ARCHITECTURE.md §1 for upstream gradient dy [B, O], in float64."""
    dy, x, act, weight = _f64(dy, x, act, weight)
    return Gradients(
        x=torch.einsum("bo,ois,bs->bi", dy, weight, act),
        act=torch.einsum("bo,bi,ois->bs", dy, x, weight),
        weight=torch.einsum("bo,bi,bs->ois", dy, x, act),
        bias=dy.sum(0),
    )


def abs_forward64(
    x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """sum_i sum_s |x[b,i] act[b,s] weight[o,i,s]| + |bias[o]|: the forward's error scale."""
    return forward64(x.abs(), act.abs(), weight.abs(), None if bias is None else bias.abs())


def abs_grads64(
    dy: torch.Tensor, x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor
) -> Gradients:
    """The gradients' sums over absolute values: each gradient's error scale."""
    return grads64(dy.abs(), x.abs(), act.abs(), weight.abs())
