"""GLAIEstimator, the nn.Module around the op."""

from __future__ import annotations

import math

import pytest
import torch

from glai_kernels import GLAIEstimator
from reference import forward64


def test_shapes_and_initialisation_bound():
    torch.manual_seed(0)
    module = GLAIEstimator(7, 5, 3)
    assert module.weight.shape == (3, 7, 5) and module.bias.shape == (3,)
    bound = 1 / math.sqrt(7 * 5)
    assert module.weight.abs().max() <= bound and module.bias.abs().max() <= bound
    assert module.weight.std() > bound / 4  # drawn, not constant


def test_forward_matches_oracle_and_trains():
    torch.manual_seed(1)
    module = GLAIEstimator(6, 4, 2, backend="torch")
    x, act = torch.randn(32, 6), (torch.rand(32, 4) < 0.5).float()
    target = torch.randn(32, 2)
    torch.testing.assert_close(module(x, act).double(),
                               forward64(x, act, module.weight, module.bias))
    optimizer = torch.optim.Adam(module.parameters(), lr=0.05)
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        loss = (module(x, act) - target).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_without_bias_and_dtype():
    module = GLAIEstimator(3, 2, 4, bias=False, dtype=torch.float64)
    assert module.bias is None and module.weight.dtype == torch.float64
    assert module(torch.randn(2, 3, dtype=torch.float64),
                  torch.randn(2, 2, dtype=torch.float64)).shape == (2, 4)
    assert "bias=False" in repr(module)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="paths must be a positive int"):
        GLAIEstimator(3, bad, 2)
