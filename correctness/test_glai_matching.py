"""Parameter matching (docs/ARCHITECTURE.md §4.5, the paper's Section 4.2 and Remark 5), counted
from modules."""

from __future__ import annotations

import pytest
import torch
from glai_models import random_mlp

from glai_kernels.glai import count_parameters, from_mlp, make_mlp, match, path_budget, prune
from glai_kernels.paper_heads import PAPER_HEADS

# docs/ARCHITECTURE.md §3's table: original, reduced, dense estimator I*P*O, μ = (O − R)/(I*P*O)
# in %
TABLE1_COUNTS = {
    "A1": (108_069, 54_053, 1_823_360, 2.96), "A2": (98_948, 49_476, 196_864, 25.1),
    "B1": (901_888, 451_008, 52_469_760, 0.86), "B2": (689_024, 344_576, 37_797_888, 0.91),
    "C1": (148_997, 74_501, 369_280, 20.2), "C2": (395_780, 197_892, 787_456, 25.1),
}


@pytest.mark.parametrize("name", list(PAPER_HEADS))
def test_paper_heads_match_the_original_exactly(name):
    torch.manual_seed(0)
    h = PAPER_HEADS[name]
    original = make_mlp((h.n0, h.n1, h.n2))
    reduced, head, budget = match(original, h.rho)
    n_original, n_reduced, dense, mu_percent = TABLE1_COUNTS[name]
    assert count_parameters(original) == sum(p.numel() for p in original.parameters())
    assert (budget.original, budget.reduced, budget.available) == (n_original, n_reduced, dense)
    assert head.weight.shape == (h.n2, h.inputs, h.paths)
    # the estimator's output bias is part of the budget, so μ sits just under docs/ARCHITECTURE.md
    # §3's (O−R)/E
    assert budget.mu == pytest.approx(mu_percent / 100, abs=5e-4)
    assert (n_original - n_reduced - h.n2) / dense == budget.mu and not budget.capped
    pruned = prune(head, torch.randn(64, h.n0), keep=budget.keep).head
    assert count_parameters(reduced) + count_parameters(pruned) == count_parameters(original)
    # the paper's Example 1 (B1: R = 225K, E = 13M, μ = 5.2%) does not follow from its formulas
    if name == "B1":
        assert budget.reduced != 225_000 and budget.available > 13_000_000


def test_two_hidden_layers_match_exactly():
    original = random_mlp((20, 16, 12, 5), seed=1)
    reduced, head, budget = match(original, 0.5)
    assert count_parameters(reduced) == (20 * 8 + 8) + (8 * 6 + 6) + (6 * 5 + 5)
    # paths that exist: (n0+1)*n1'*n2'*O plus the layer-2 bias paths n2'*O (no structural zeros)
    assert budget.available == 21 * 8 * 6 * 5 + 6 * 5 == head.path_count()
    pruned = prune(head, torch.randn(32, 20, dtype=torch.float64), keep=budget.keep).head
    assert count_parameters(reduced) + count_parameters(pruned) == count_parameters(original)


def test_remark5_small_rho_keeps_every_path_and_says_so():
    original = make_mlp((4, 100, 2))  # 702 parameters
    _reduced, _head, budget = match(original, 0.1)  # (4, 10, 2): 72; paths 5*10*2 = 100
    assert budget.capped and budget.keep == budget.available == 100 and budget.mu == 1
    assert budget.glai_total == 72 + 2 + 100 < count_parameters(original)


def test_rho_too_large_leaves_no_budget():
    original = make_mlp((4, 10, 2))
    with pytest.raises(ValueError, match="choose a smaller rho"):
        match(original, 1.0)


def test_count_parameters_skips_masked_weights_and_buffers():
    head = from_mlp(random_mlp((5, 4, 3, 2), seed=2))
    assert count_parameters(head) == head.path_count() + 2 < head.weight.numel() + 2
    assert count_parameters(head.selector) == 0  # frozen buffers are not parameters
    original, reduced = make_mlp((5, 10, 9, 2)), make_mlp((5, 4, 3, 2))  # 179, 47 parameters
    budget = path_budget(original, reduced, head)
    assert budget.keep == 179 - 47 - 2 < head.path_count() and not budget.capped
