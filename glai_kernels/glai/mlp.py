"""The MLPs GLAI starts from: parsing the accepted form, building and reducing them.

Accepted form (what `from_mlp` converts): an `nn.Sequential` of L+1 >= 2 `nn.Linear` layers
with an `nn.ReLU` after every Linear but the last, optionally followed by one `nn.Dropout`:

    Linear(n0, n1), ReLU(), [Dropout], Linear(n1, n2), ReLU(), [Dropout], ..., Linear(nL, nL+1)

Linears may lack a bias (it counts as zero). Anything else (another activation, dropout on
the input or the output, a LayerNorm, nested containers) is rejected with the position and
type of the offending module: only ReLU networks are piecewise linear with 0/1 activation
patterns, which is what the conversion (Theorem 1) rewrites.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class MLPLayers:
    """A parsed MLP: its L+1 Linear layers and the dropout rate after each hidden layer."""

    linears: tuple[nn.Linear, ...]
    dropout: tuple[float, ...]  # one per hidden layer (L entries), 0.0 where none

    @property
    def widths(self) -> tuple[int, ...]:
        """(n0, n1, ..., n_{L+1})."""
        return (self.linears[0].in_features, *(lin.out_features for lin in self.linears))

    @property
    def hidden_layers(self) -> int:
        return len(self.linears) - 1


def parse_mlp(mlp: nn.Module) -> MLPLayers:
    """The Linear layers and dropout rates of an MLP in the accepted form (module docstring).

    Raises TypeError/ValueError naming the argument `mlp` and the offending position.
    """
    if not isinstance(mlp, nn.Sequential):
        raise TypeError(f"mlp must be an nn.Sequential of Linear/ReLU(/Dropout) layers, "
                        f"got {type(mlp).__name__}")
    modules = list(mlp)
    linears: list[nn.Linear] = []
    dropout: list[float] = []
    pos = 0

    def fail(why: str) -> ValueError:
        found = ", ".join(f"[{k}] {type(m).__name__}" for k, m in enumerate(modules))
        return ValueError(f"mlp is not Linear, ReLU, [Dropout], ..., Linear: {why} "
                          f"(modules: {found or 'none'})")

    while True:
        if pos >= len(modules) or not isinstance(modules[pos], nn.Linear):
            got = type(modules[pos]).__name__ if pos < len(modules) else "the end"
            raise fail(f"expected nn.Linear at position {pos}, found {got}")
        if linears and modules[pos].in_features != linears[-1].out_features:
            raise fail(f"Linear at position {pos} takes {modules[pos].in_features} inputs but "
                       f"the previous layer gives {linears[-1].out_features}")
        linears.append(modules[pos])
        pos += 1
        if pos == len(modules):
            break
        if not isinstance(modules[pos], nn.ReLU):
            raise fail(f"expected nn.ReLU at position {pos} (after a hidden Linear), "
                       f"found {type(modules[pos]).__name__}")
        pos += 1
        rate = 0.0
        if pos < len(modules) and isinstance(modules[pos], nn.Dropout):
            rate = float(modules[pos].p)
            pos += 1
        dropout.append(rate)
    if len(linears) < 2:
        raise fail("an MLP needs at least one hidden layer (two Linear layers)")
    return MLPLayers(tuple(linears), tuple(dropout))


def make_mlp(
    widths: Sequence[int],
    *,
    dropout: float | Sequence[float] = 0.0,
    bias: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Sequential:
    """An MLP in the accepted form with layer widths (n0, n1, ..., n_{L+1}).

    `dropout` is one rate for every hidden layer or one per hidden layer; 0 adds no module.
    """
    widths = [int(w) for w in widths]
    if len(widths) < 3 or min(widths) < 1:
        raise ValueError(f"widths must be (n0, n1, ..., n_out) with at least one hidden layer "
                         f"and positive sizes, got {widths}")
    hidden = len(widths) - 2
    rates = [float(dropout)] * hidden if isinstance(dropout, (int, float)) else list(dropout)
    if len(rates) != hidden:
        raise ValueError(f"dropout must give one rate per hidden layer ({hidden}), got {rates}")
    layers: list[nn.Module] = []
    factory = {"device": device, "dtype": dtype}
    for k in range(hidden + 1):
        layers.append(nn.Linear(widths[k], widths[k + 1], bias=bias, **factory))
        if k < hidden:
            layers.append(nn.ReLU())
            if rates[k] > 0:
                layers.append(nn.Dropout(rates[k]))
    return nn.Sequential(*layers)


def reduced_widths(widths: Sequence[int], rho: float) -> tuple[int, ...]:
    """(n0, round(rho*n1), ..., round(rho*nL), n_{L+1}): every hidden layer scaled by rho.

    The paper (Section 4.2) requires rho*nL >= n_{L+1} so the last hidden layer is no
    bottleneck; this raises ValueError when it is violated or a layer would vanish.
    """
    if not 0 < rho <= 1:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    widths = tuple(int(w) for w in widths)
    hidden = tuple(round(rho * n) for n in widths[1:-1])
    if min(hidden) < 1:
        raise ValueError(f"rho={rho} leaves an empty hidden layer in {widths}")
    if hidden[-1] < widths[-1]:
        raise ValueError(f"rho={rho} gives a last hidden layer of {hidden[-1]} units, fewer than "
                         f"the {widths[-1]} outputs (the paper requires rho*nL >= n_(L+1))")
    return (widths[0], *hidden, widths[-1])


def reduce_mlp(mlp: nn.Module, rho: float) -> nn.Sequential:
    """A freshly initialised MLP of the same form with every hidden layer scaled by rho
    (the paper's reduced MLP, trained from scratch), on the original's device and dtype."""
    layers = parse_mlp(mlp)
    first = layers.linears[0].weight
    return make_mlp(reduced_widths(layers.widths, rho), dropout=layers.dropout,
                    bias=layers.linears[0].bias is not None,
                    device=first.device, dtype=first.dtype)
