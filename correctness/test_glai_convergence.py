"""Structural convergence (docs/ARCHITECTURE.md §4.7): the path distance m_t and the switching
rules."""

from __future__ import annotations

import pytest
import torch
from glai_models import random_mlp, unseen_inputs

from glai_kernels.glai import (
    StructureMonitor,
    fixed_reduced_epochs,
    path_activations,
    path_distance,
)


def brute_force_m(mlp_a, mlp_b, omega):
    """The definition, literally: mean over paths (o, i, s) of (1/|Ω|) Σ_{x: ind differs} |x_i|."""
    act_a, support = path_activations(mlp_a, omega)
    act_b, _ = path_activations(mlp_b, omega)
    outputs = mlp_a[-1].out_features
    total, count = 0.0, 0
    for _o in range(outputs):
        for i in range(support.shape[0]):
            for s in range(support.shape[1]):
                if not support[i, s]:
                    continue
                count += 1
                d = 0.0
                for n, x in enumerate(omega):
                    x_i = float(x[i]) if i < omega.shape[1] else 1.0
                    if act_a[n, s] != act_b[n, s]:
                        d += abs(x_i)
                total += d / len(omega)
    return total / count


@pytest.mark.parametrize("widths", [(4, 6, 2), (3, 4, 3, 2)], ids=["L1", "L2"])
def test_m_is_zero_for_identical_epochs_and_positive_when_the_pattern_changes(widths):
    mlp = random_mlp(widths, seed=1)
    omega = unseen_inputs(25, widths[0], seed=2) / 1e3
    monitor = StructureMonitor(omega)
    assert monitor.observe(mlp) is None
    assert monitor.observe(mlp) == 0.0  # nothing changed
    moved = random_mlp(widths, seed=1)
    with torch.no_grad():
        moved[0].bias.add_(0.7 * torch.randn(moved[0].bias.shape, dtype=torch.float64,
                                             generator=torch.Generator().manual_seed(3)))
    expected = brute_force_m(mlp, moved, omega)
    got = monitor.observe(moved)
    assert got > 0
    assert got == pytest.approx(expected, rel=1e-12)
    assert monitor.history == [0.0, got]


def test_path_distance_checks_shapes():
    with pytest.raises(ValueError, match="share N"):
        path_distance(torch.ones(3, 2), torch.ones(4, 2), torch.ones(3, 5))


def test_fixed_fractions_are_the_papers():
    assert fixed_reduced_epochs("A", 60) == 12  # 20%
    assert fixed_reduced_epochs("B", 31) == 5  # 15% of 31 = 4.65
    assert fixed_reduced_epochs("C", 154) == 15  # 10%
    assert fixed_reduced_epochs("C", 3) == 1  # at least one epoch
    with pytest.raises(ValueError, match="family"):
        fixed_reduced_epochs("D", 10)


def test_settled_rule():
    monitor = StructureMonitor(torch.zeros(1, 1), rel_tol=0.1, patience=2)
    for m, settled in [(1.0, False), (0.5, False), (0.08, False), (0.09, True), (0.2, False)]:
        monitor.history.append(m)
        assert monitor.settled() == settled


def test_settled_on_a_plateau():
    """m_t on a noise floor above rel_tol * peak: settled once `plateau` epochs set no low
    `plateau_tol` below the earlier ones (and not while m_t still falls)."""
    monitor = StructureMonitor(torch.zeros(1, 1), rel_tol=0.1, patience=2, plateau=3,
                               plateau_tol=0.1)
    falling = [1.0, 0.8, 0.6, 0.45, 0.35, 0.3]
    floor = [0.29, 0.31, 0.28]  # lowest 0.28 >= 0.9 * 0.3
    for m in falling:
        monitor.history.append(m)
        assert not monitor.settled()
    for k, m in enumerate(floor):
        monitor.history.append(m)
        assert monitor.settled() == (k == len(floor) - 1)
    off = StructureMonitor(torch.zeros(1, 1), plateau=None)
    off.history.extend(falling + floor)
    assert not off.settled()


def test_m_grows_with_the_size_of_the_weight_change():
    mlp = random_mlp((6, 40, 3), seed=4)
    omega = unseen_inputs(300, 6, seed=5) / 1e3
    noise = torch.randn(40, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    distances = []
    for step in (1e-3, 1e-2, 1e-1, 1.0):
        moved = random_mlp((6, 40, 3), seed=4)
        with torch.no_grad():
            moved[0].weight.add_(step * noise)
        monitor = StructureMonitor(omega)
        monitor.observe(mlp)
        distances.append(monitor.observe(moved))
    assert distances == sorted(distances) and distances[0] < distances[-1] / 20
