"""`GLAIHead`: a frozen path selector feeding the estimator op; a drop-in MLP head."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from glai_kernels import registry
from glai_kernels.glai.selector import PathSelector
from glai_kernels.op import backend_for, estimator


def _zero_pruned_gradient(module_ref: weakref.ref) -> Callable[[torch.Tensor], None]:
    """A post-accumulate-grad hook: zero the gradient of pruned path weights, in place, once
    per backward (however many forwards fed it). A weight that starts at zero with zero
    gradient and zero optimizer state stays exactly zero under SGD/Adam/AdamW with weight
    decay, whose update of such an entry is 0."""

    def hook(param: torch.Tensor) -> None:
        module = module_ref()
        if module is not None and module._pruned is not None and param.grad is not None:
            param.grad.masked_fill_(module._pruned, 0)

    return hook


class GLAIHead(nn.Module):
    """y = estimator([x, 1], selector(x), weight, bias): a GLAI model as an nn.Module.

    Shapes: x [B, n0] -> y [B, O]; weight [O, I = n0+1, P]; act [B, P] from the frozen
    selector. Only `weight` and `bias` are parameters (the selector's layers are buffers).
    `weight_mask` (bool [O, I, P], or None for all) marks the path weights that exist: entries
    outside it are zero, get zero gradient (a post-accumulate-grad hook zeroes it in place
    after each backward), and are not counted by `num_parameters()`.
    `backend_used` records the estimator backend of the last forward.
    Build one with `glai_kernels.from_mlp(mlp)`; prune with `glai_kernels.glai.prune`.
    """

    def __init__(
        self,
        selector: PathSelector,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        *,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        n0 = selector.widths[0]
        if weight.dim() != 3 or weight.shape[1:] != (n0 + 1, selector.paths):
            raise ValueError(f"weight must be [O, {n0 + 1}, {selector.paths}] for this "
                             f"selector, got {list(weight.shape)}")
        if mask is not None and (mask.shape != weight.shape or mask.dtype != torch.bool):
            raise ValueError(f"mask must be bool {list(weight.shape)}, got {mask.dtype} "
                             f"{list(mask.shape)}")
        if bias is not None and bias.shape != weight.shape[:1]:
            raise ValueError(f"bias must be [{weight.shape[0]}], got {list(bias.shape)}")
        registry.requested_name(backend)  # an unknown backend name fails here, not mid-training
        self.selector = selector
        weight = weight.detach().clone()
        pruned = None if mask is None else ~mask
        if pruned is not None:
            weight.masked_fill_(pruned, 0)
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        self.register_buffer("weight_mask", None if mask is None else mask.clone())
        # the complement, kept so each step's gradient masking is one in-place pass
        self.register_buffer("_pruned", pruned, persistent=False)
        self._hooked: int | None = None
        self.backend = backend
        self.backend_used: str | None = None
        self._ensure_gradient_mask()

    def _ensure_gradient_mask(self) -> None:
        # Hooks live on the Parameter object and are not deep-copied, so a copied head (or one
        # whose Parameter was replaced) registers its own on first use.
        if self._pruned is not None and self._hooked != id(self.weight):
            self.weight.register_post_accumulate_grad_hook(
                _zero_pruned_gradient(weakref.ref(self)))
            self._hooked = id(self.weight)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        if self.weight_mask is not None:  # a loaded mask replaces its complement too
            self._pruned = ~self.weight_mask

    @property
    def in_features(self) -> int:
        return self.selector.widths[0]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def paths(self) -> int:
        """P, the estimator's path columns (dense size of its last dimension)."""
        return self.weight.shape[2]

    def path_count(self) -> int:
        """Path weights that exist (kept and not structurally zero)."""
        if self.weight_mask is None:
            return self.weight.numel()
        return int(self.weight_mask.sum())

    def num_parameters(self) -> int:
        """Trainable parameters: kept path weights plus the output bias."""
        return self.path_count() + (self.bias.numel() if self.bias is not None else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, n0] -> y [B, O]."""
        act = self.selector(x)
        x_aug = F.pad(x, (0, 1), value=1.0)  # the constant-1 input carries the hidden biases
        if self._pruned is not None and torch.is_grad_enabled():
            self._ensure_gradient_mask()
        name = backend_for(x_aug, self.backend)
        self.backend_used = name
        return estimator(x_aug, act, self.weight, self.bias, backend=name)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, paths={self.paths}, "
                f"out_features={self.out_features}, kept={self.path_count()}/"
                f"{self.weight.numel()}, backend={self.backend or 'env/auto'}")
