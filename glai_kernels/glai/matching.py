"""Parameter matching (the paper's Section 4.2, Remark 5): how many path weights GLAI may keep
so that reduced MLP + estimator has as many parameters as the original MLP.

Everything is counted from real nn.Module objects (docs/ARCHITECTURE.md §3 warns that the paper's
Example 1
numbers do not follow its own formulas). As the paper does, the whole reduced MLP counts
(its output layer too, though the selector only needs its hidden layers), and so does the
estimator's output bias; the path weights get the rest:

    keep = count(original) − count(reduced MLP) − count(estimator bias)
    count(reduced MLP) + count(pruned GLAIHead) == count(original)     (exactly, no rounding)

μ = keep / (path weights that exist). If keep exceeds them, every path is kept and GLAI ends up
smaller than the original (Remark 5); `Budget.capped` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from glai_kernels.glai.convert import from_mlp
from glai_kernels.glai.head import GLAIHead
from glai_kernels.glai.mlp import reduce_mlp


def count_parameters(module: nn.Module) -> int:
    """Parameter elements of `module` and its children. A parameter `name` with a bool buffer
    `name_mask` beside it (a GLAIHead's weight) counts only its True entries: pruned and
    structurally zero path weights are not parameters. Buffers (the frozen selector) are not
    counted."""
    total = 0
    for sub in module.modules():
        for name, param in sub.named_parameters(recurse=False):
            mask = getattr(sub, f"{name}_mask", None)
            total += int(mask.sum()) if mask is not None else param.numel()
    return total


@dataclass(frozen=True)
class Budget:
    """Parameter counts (from modules) and the path budget they leave."""

    original: int
    reduced: int
    estimator_bias: int
    available: int  # path weights that exist in the unpruned estimator
    keep: int  # path weights to keep (<= available)
    capped: bool  # Remark 5: the budget exceeded the available paths; all are kept

    @property
    def mu(self) -> float:
        """Fraction of the existing path weights kept."""
        return self.keep / self.available

    @property
    def glai_total(self) -> int:
        return self.reduced + self.estimator_bias + self.keep


def path_budget(original: nn.Module, reduced: nn.Module, head: GLAIHead) -> Budget:
    """The path budget for `head` (converted from `reduced`) to match `original`."""
    bias = head.bias.numel() if head.bias is not None else 0
    n_original, n_reduced = count_parameters(original), count_parameters(reduced)
    keep = n_original - n_reduced - bias
    if keep < 1:
        raise ValueError(f"the reduced MLP ({n_reduced} parameters) plus the estimator bias "
                         f"({bias}) leaves no budget under the original's {n_original}: "
                         f"choose a smaller rho")
    available = head.path_count()
    return Budget(n_original, n_reduced, bias, available, min(keep, available),
                  keep > available)


def match(original: nn.Module, rho: float) -> tuple[nn.Sequential, GLAIHead, Budget]:
    """(reduced MLP, its unpruned GLAI head, budget) for reduction factor rho: μ from ρ.

    The reduced MLP is freshly initialised (train it, then convert it again with `from_mlp`
    and prune to `budget.keep`); the budget depends only on the architecture.
    """
    reduced = reduce_mlp(original, rho)
    head = from_mlp(reduced)
    return reduced, head, path_budget(original, reduced, head)
