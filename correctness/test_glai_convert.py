"""Exact conversion (the paper's Theorem 1, with biases): from_mlp(mlp)(x) == mlp(x)."""

from __future__ import annotations

import copy

import pytest
import torch
from glai_models import random_mlp, relative_error, unseen_inputs
from torch import nn

import glai_kernels
from glai_kernels.glai import GLAIHead, all_paths, from_mlp, make_mlp, reduce_mlp, reduced_widths
from reference import tolerance

WIDTHS = [
    (1, 1, 1), (7, 5, 3), (12, 127, 4), (33, 129, 7),       # one hidden layer
    (6, 7, 5, 3), (9, 4, 13, 2), (1, 3, 2, 1),              # two hidden layers
    (5, 3, 4, 2, 3),                                        # three
]


@pytest.mark.parametrize("widths", WIDTHS, ids=lambda w: "-".join(map(str, w)))
@pytest.mark.parametrize("bias", [True, False])
def test_exact_in_float64(widths, bias):
    mlp = random_mlp(widths, seed=sum(widths), bias=bias)
    head = from_mlp(mlp)
    for batch in (1, 7, 129):
        x = unseen_inputs(batch, widths[0], seed=batch)
        with torch.no_grad():
            assert relative_error(head(x), mlp(x)) <= 1e-10


def test_non_contiguous_inputs_and_no_modification():
    mlp = random_mlp((11, 9, 6, 4), seed=2)
    head = from_mlp(mlp)
    wide = unseen_inputs(13, 22, seed=3)
    x = wide[:, ::2]  # a strided view
    assert not x.is_contiguous()
    before = x.clone()
    with torch.no_grad():
        assert relative_error(head(x), mlp(x.contiguous())) <= 1e-10
    assert torch.equal(x, before)


def test_path_count_and_structure():
    head = from_mlp(random_mlp((6, 7, 5, 3), seed=0))
    assert head.paths == 7 * 5 + 5  # pair paths, then the layer-2 bias paths
    assert head.weight.shape == (3, 7, 40)
    # bias paths carry only the constant input: 3 outputs x 5 units structurally zero elsewhere
    assert head.path_count() == 3 * 7 * 35 + 3 * 5
    assert bool((head.weight.detach()[~head.weight_mask] == 0).all())
    units, start = all_paths((7, 5))
    assert start.tolist() == [1] * 35 + [2] * 5
    assert units[:, 36].tolist() == [7, 1]  # sentinel on layer 1, unit 1 on layer 2


def test_every_backend_is_exact(backend_device):
    backend, device = backend_device
    dtype = torch.float64
    if dtype not in glai_kernels.registry.get(backend).dtypes:
        dtype = torch.float32
    mlp = random_mlp((9, 7, 4, 3), seed=3, dtype=dtype).to(device)
    head = from_mlp(mlp, backend=backend)
    x = unseen_inputs(17, 9, seed=4, dtype=dtype).to(device) / 1e3  # one decade of scale
    with torch.no_grad():
        error = relative_error(head(x).double(), mlp(x).double())
    assert head.backend_used == backend
    assert error <= (1e-10 if dtype == torch.float64 else 100 * tolerance(dtype))


def test_dropout_in_training_mode_matches_the_mlp_for_one_hidden_layer():
    # the same seed draws the same mask over the [B, n1] hidden units in both
    mlp = random_mlp((8, 16, 3), seed=5, dropout=0.3).train()
    head = from_mlp(mlp).train()
    x = unseen_inputs(11, 8, seed=6) / 1e3
    torch.manual_seed(7)
    expected = mlp(x)
    torch.manual_seed(7)
    assert relative_error(head(x), expected) <= 1e-10
    assert relative_error(head.eval()(x), mlp.eval()(x)) <= 1e-10
    assert not torch.equal(expected, mlp(x))  # dropout really acted


def test_drop_in_head_trains_only_path_weights():
    torch.manual_seed(8)
    mlp = random_mlp((10, 12, 4), seed=8, dtype=torch.float32)
    state = copy.deepcopy(mlp.state_dict())
    head = from_mlp(mlp)
    assert all(torch.equal(state[k], v) for k, v in mlp.state_dict().items())  # not modified
    assert [name for name, _ in head.named_parameters()] == ["weight", "bias"]
    frozen = {k: v.clone() for k, v in head.selector.state_dict().items()}
    x, y = torch.randn(64, 10), torch.randint(0, 4, (64,))
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(head(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert all(torch.equal(frozen[k], v) for k, v in head.selector.state_dict().items())


def test_follows_dtype_and_device_and_moves():
    head = from_mlp(random_mlp((5, 4, 2), seed=9, dtype=torch.float32))
    assert head.weight.dtype == torch.float32 and head.selector.weight0.dtype == torch.float32
    head = head.double()
    x = torch.randn(3, 5, dtype=torch.float64)
    assert head(x).dtype == torch.float64


@pytest.mark.parametrize("widths", [(5, 4, 2), (6, 7, 5, 3)])
def test_every_tensor_lands_on_the_mlps_device(widths):
    # the meta device stands in for a GPU: the selector's path tables are built on the CPU and
    # once stayed there under a CUDA MLP (index_select then failed on a real GPU)
    head = from_mlp(random_mlp(widths, seed=9, dtype=torch.float32).to("meta"))
    placed = {name: t.device.type for name, t in [*head.named_parameters(),
                                                  *head.named_buffers()]}
    assert set(placed.values()) == {"meta"}, placed


@pytest.mark.parametrize("bad, match", [
    (nn.Linear(3, 2), "must be an nn.Sequential"),
    (nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), "expected nn.ReLU at position 1"),
    (nn.Sequential(nn.Dropout(0.1), nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)),
     "expected nn.Linear at position 0"),
    (nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.ReLU()),
     "expected nn.Linear at position 4"),
    (nn.Sequential(nn.Linear(3, 4)), "at least one hidden layer"),
    (nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(5, 2)), "takes 5 inputs"),
    (nn.Sequential(), "expected nn.Linear at position 0"),
])
def test_rejects_other_modules_with_a_clear_error(bad, match):
    with pytest.raises((TypeError, ValueError), match=match) as info:
        from_mlp(bad)
    assert "mlp" in str(info.value)


def test_rejects_wrong_input_and_backend():
    head = from_mlp(random_mlp((5, 4, 2), seed=1))
    with pytest.raises(ValueError, match=r"x must be \[B, 5\]"):
        head(torch.randn(3, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown estimator backend"):
        from_mlp(random_mlp((5, 4, 2), seed=1), backend="nope")
    with pytest.raises(ValueError, match="weight must be"):
        GLAIHead(head.selector, torch.zeros(2, 5, 4))


def test_reduced_mlp_widths_and_bottleneck_rule():
    assert reduced_widths((384, 256, 37), 0.5) == (384, 128, 37)
    assert reduced_widths((10, 9, 6, 3), 0.5) == (10, 4, 3, 3)
    with pytest.raises(ValueError, match="fewer than the 4 outputs"):
        reduced_widths((10, 6, 4), 0.5)
    reduced = reduce_mlp(make_mlp((8, 20, 4), dropout=0.2), 0.5)
    assert [type(m).__name__ for m in reduced] == ["Linear", "ReLU", "Dropout", "Linear"]
    assert reduced[0].out_features == 10
