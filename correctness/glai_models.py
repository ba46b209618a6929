"""Seeded random ReLU MLPs with non-zero biases for the GLAI tests."""

from __future__ import annotations

import torch
from torch import nn

from glai_kernels.glai import make_mlp


def random_mlp(widths, *, seed: int, dtype=torch.float64, dropout=0.0, bias=True) -> nn.Sequential:
    """An MLP in the accepted form; weights ~ N(0, 1/fan_in), biases ~ N(0, 0.5) so that
    every layer has active and inactive units and the biases matter."""
    gen = torch.Generator().manual_seed(seed)
    mlp = make_mlp(widths, dropout=dropout, bias=bias, dtype=dtype)
    with torch.no_grad():
        for layer in mlp:
            if isinstance(layer, nn.Linear):
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen, dtype=dtype)
                                   / layer.in_features ** 0.5)
                if layer.bias is not None:
                    layer.bias.copy_(0.5 * torch.randn(layer.bias.shape, generator=gen,
                                                       dtype=dtype))
    return mlp


def unseen_inputs(batch: int, n0: int, *, seed: int, dtype=torch.float64) -> torch.Tensor:
    """Inputs from a mixture the conversion never saw: Gaussian at three scales, heavy-tailed
    (Cauchy) rows and sparse rows."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n0, generator=gen, dtype=dtype)
    scale = torch.tensor([1e-3, 1.0, 1e3], dtype=dtype)[torch.arange(batch) % 3]
    x = x * scale.unsqueeze(1)
    cauchy = torch.tan(torch.pi * (torch.rand(batch, n0, generator=gen, dtype=dtype) - 0.5))
    x = torch.where((torch.arange(batch) % 4 == 1).unsqueeze(1), cauchy, x)
    sparse = torch.rand(batch, n0, generator=gen, dtype=dtype) < 0.2
    return torch.where((torch.arange(batch) % 5 == 2).unsqueeze(1), x * sparse, x)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|, rowwise (inputs span six decades)."""
    scale = expected.abs().amax(1, keepdim=True).clamp_min(torch.finfo(expected.dtype).tiny)
    return float(((actual - expected).abs() / scale).max().detach())
