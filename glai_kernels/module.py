"""`GLAIEstimator`: the estimator as an nn.Module holding weight [O, I, P] (and bias [O])."""

from __future__ import annotations

import math

import torch
from torch import nn

from glai_kernels import registry
from glai_kernels.op import estimator
from glai_kernels.registry import AUTO


class GLAIEstimator(nn.Module):
    """y = estimator(x, act, weight, bias) with trainable weight [O, I, P] and bias [O].

    Initialisation: weight and bias uniform in [-1/sqrt(I*P), 1/sqrt(I*P)], as nn.Linear
    initialises a layer with I*P inputs, since the estimator is linear in the I*P products
    x[b, i] * act[b, s]. A converted GLAI head (`glai_kernels.from_mlp`) overwrites this with
    the MLP's path weights.

    Args:
        in_features: I.  paths: P.  out_features: O.
        bias: whether to hold a bias [O].
        backend: backend name for every call; None follows $GLAI_BACKEND, else "auto".
    """

    def __init__(
        self,
        in_features: int,
        paths: int,
        out_features: int,
        bias: bool = True,
        *,
        backend: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("paths", paths),
                            ("out_features", out_features)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GLAIEstimator: {name} must be a positive int, got {value!r}")
        self.in_features, self.paths, self.out_features = in_features, paths, out_features
        if backend is not None and backend != AUTO and backend not in registry.names():
            # fail here, not at the first forward
            raise ValueError(f"GLAIEstimator: backend={backend!r} is not a registered backend; "
                             f"registered: {', '.join([AUTO, *sorted(registry.names())])}")
        self.backend = backend
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, paths, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features * self.paths)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """x [B, I], act [B, P] -> y [B, O]."""
        return estimator(x, act, self.weight, self.bias, backend=self.backend)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, paths={self.paths}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
