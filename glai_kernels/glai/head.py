"""`GLAIHead`: a frozen path selector feeding the estimator op; a drop-in MLP head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glai_kernels import registry
from glai_kernels.glai.selector import PathSelector
from glai_kernels.op import estimator


class _MaskGradient(torch.autograd.Function):
    """Identity forward; backward zeroes the gradient outside the mask, so weights outside it
    get exactly zero gradient and, starting at zero, stay zero under SGD/Adam/AdamW with
    weight decay (their update of a zero weight with zero gradient and zero state is 0)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(mask)
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return torch.where(mask, grad, 0), None


class GLAIHead(nn.Module):
    """y = estimator([x, 1], selector(x), weight, bias): a GLAI model as an nn.Module.

    Shapes: x [B, n0] -> y [B, O]; weight [O, I = n0+1, P]; act [B, P] from the frozen
    selector. Only `weight` and `bias` are parameters (the selector's layers are buffers).
    `weight_mask` (bool [O, I, P], or None for all) marks the path weights that exist: entries
    outside it are zero, get zero gradient, and are not counted by `num_parameters()`.
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
        if mask is not None:
            weight.masked_fill_(~mask, 0)
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        self.register_buffer("weight_mask", None if mask is None else mask.clone())
        self.backend = backend
        self.backend_used: str | None = None

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
        weight = self.weight
        if self.weight_mask is not None and weight.requires_grad and torch.is_grad_enabled():
            weight = _MaskGradient.apply(weight, self.weight_mask)
        impl = registry.resolve(self.backend, x.device, x.dtype)
        self.backend_used = impl.name
        return estimator(x_aug, act, weight, self.bias, backend=impl.name)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, paths={self.paths}, "
                f"out_features={self.out_features}, kept={self.path_count()}/"
                f"{self.weight.numel()}, backend={self.backend or 'env/auto'}")
