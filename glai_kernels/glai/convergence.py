"""Structural convergence (the paper's Section 3.6): when has the reduced MLP's activation
structure settled enough to freeze it?

Path distance between epochs t and t+1 over a reference set Ω (docs/ARCHITECTURE.md §4.7):

    m_t = (1/#paths) Σ_p d(c_p^t, c_p^{t+1}),   d(π, π') = (1/|Ω|) Σ_{x in Ω: ind differs} |x_i|

where p runs over every path (o, i, s); d does not depend on the output o, so the mean over
(o, i, s) equals the mean over the (input, column) pairs that are paths.

The paper leaves the switching rule open and uses fixed fractions of the original MLP's
epochs (Section 4.1: 20% family A, 15% B, 10% C): `fixed_reduced_epochs` is that default.
`StructureMonitor.settled()` is an optional automatic rule (ours, not the paper's): m_t has
stayed at or below `rel_tol` times its largest value so far for `patience` epochs, or m_t
has stopped falling: the last `plateau` epochs set no low `plateau_tol` below the lowest m_t
before them. The second clause is for training noise: with dropout (family B) m_t settles
on a floor of 15-30% of its peak, set by the SGD noise, and never reaches a tenth of it
(measured: the B1 and B2 reduced MLPs ran their whole 60-epoch cap under the first clause
alone, their m_t flat at that floor from about epoch 20).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from glai_kernels.glai.mlp import parse_mlp
from glai_kernels.glai.selector import PathSelector

FIXED_FRACTIONS = {"A": 0.20, "B": 0.15, "C": 0.10}


def fixed_reduced_epochs(family: str, original_epochs: int) -> int:
    """The paper's rule: round(fraction × the original MLP's epochs), at least 1."""
    if family not in FIXED_FRACTIONS:
        raise ValueError(f"family must be one of {sorted(FIXED_FRACTIONS)}, got {family!r}")
    return max(1, math.floor(FIXED_FRACTIONS[family] * original_epochs + 0.5))


@torch.no_grad()
def path_activations(mlp: nn.Module, reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(act [N, P] of every path column, support [I, P]) of the MLP's current weights."""
    selector = PathSelector.from_layers(parse_mlp(mlp)).eval()
    return selector(reference), selector.input_support()


@torch.no_grad()
def path_distance(act_before: torch.Tensor, act_after: torch.Tensor, reference: torch.Tensor,
                  support: torch.Tensor | None = None) -> float:
    """m_t between two activation snapshots [N, P] of the same paths over `reference` [N, n0].

    `support` [n0+1, P] bool marks the (input, column) pairs that are paths (None: all).
    """
    if act_before.shape != act_after.shape or len(act_before) != len(reference):
        raise ValueError("act_before, act_after and reference must share N (and P)")
    magnitude = F.pad(reference, (0, 1), value=1.0).abs()  # [N, I]
    per_pair = magnitude.t() @ (act_before != act_after).to(magnitude.dtype)  # [I, P]
    if support is None:
        return float(per_pair.sum() / (len(reference) * per_pair.numel()))
    return float((per_pair * support).sum() / (len(reference) * support.sum()))


class StructureMonitor:
    """Logs m_t for an MLP after each epoch; optionally says when the structure settled.

    Call `observe(mlp)` once before training and after every epoch; `history[t-1]` is m_t,
    the distance between the patterns after epochs t-1 and t (epoch 0 = initialisation).
    """

    def __init__(self, reference: torch.Tensor, *, rel_tol: float = 0.1, patience: int = 2,
                 min_epochs: int = 1, plateau: int | None = 5,
                 plateau_tol: float = 0.1) -> None:
        self.reference = reference
        self.rel_tol, self.patience, self.min_epochs = rel_tol, patience, min_epochs
        self.plateau, self.plateau_tol = plateau, plateau_tol
        self.history: list[float] = []
        self._last: torch.Tensor | None = None

    def observe(self, mlp: nn.Module) -> float | None:
        """Record the MLP's current patterns; returns the new m_t (None on the first call)."""
        first = next(mlp.parameters())
        reference = self.reference.to(device=first.device, dtype=first.dtype)
        act, support = path_activations(mlp, reference)
        distance = None
        if self._last is not None:
            distance = path_distance(self._last, act, reference, support)
            self.history.append(distance)
        self._last = act
        return distance

    def settled(self) -> bool:
        """True once m_t <= rel_tol * max(m) for the last `patience` epochs, or (with
        `plateau`) once the last `plateau` epochs' lowest m_t is no more than `plateau_tol`
        below the lowest before them (and at least `min_epochs` epochs were observed)."""
        if len(self.history) < max(self.min_epochs, self.patience):
            return False
        peak = max(self.history)
        if all(m <= self.rel_tol * peak for m in self.history[-self.patience:]):
            return True
        window = self.plateau
        if window is None or len(self.history) <= window:
            return False
        before = min(self.history[:-window])
        return min(self.history[-window:]) >= (1.0 - self.plateau_tol) * before
