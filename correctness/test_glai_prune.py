"""Path-norm pruning (the paper's Theorem 2): the bound, the budget, zeros that stay zero."""

from __future__ import annotations

import pytest
import torch
from glai_models import random_mlp, relative_error, unseen_inputs

from glai_kernels.glai import count_parameters, from_mlp, path_norms, path_scores, prune


def l1_distance(full, pruned, omega):
    """The paper's ‖φ − φ̃‖₁ over Ω: Σ_o (1/|Ω|) Σ_x |φ_o(x) − φ̃_o(x)|."""
    with torch.no_grad():
        return float((full(omega) - pruned(omega)).abs().mean(0).sum())


@pytest.mark.parametrize("widths", [(9, 13, 4), (6, 5, 4, 3)], ids=["L1", "L2"])
@pytest.mark.parametrize("mu", [0.01, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("structured", [False, True])
def test_theorem2_bound(widths, mu, structured):
    mlp = random_mlp(widths, seed=round(100 * mu) + len(widths))
    head = from_mlp(mlp)
    omega = torch.randn(200, widths[0], dtype=torch.float64,
                        generator=torch.Generator().manual_seed(1))
    candidates = head.path_count()
    keep = max(int(mu * candidates), widths[-1] * (widths[0] + 1))  # >= one whole column
    result = prune(head, omega, keep=keep, structured=structured)
    error = l1_distance(head, result.head, omega)
    assert error <= result.dropped_score * (1 + 1e-12) + 1e-15
    # the bound is the sum of the scores of exactly the paths that were removed
    scores = path_scores(head, omega)
    assert result.dropped_score == pytest.approx(float(scores.sum()) - kept_scores(head, result,
                                                                                   scores))
    if structured:
        assert result.kept <= keep
        support = head.weight_mask if head.weight_mask is not None else torch.ones_like(
            head.weight, dtype=torch.bool)
        whole = support.sum((0, 1))  # each kept column keeps all of its paths
        assert sorted(whole[column_ids(head, result.head)].tolist()) == sorted(
            (result.head.weight_mask.sum((0, 1)) if result.head.weight_mask is not None else
             torch.full((result.head.paths,), widths[-1] * (widths[0] + 1))).tolist())
    else:
        assert result.kept == keep
    if mu <= 0.1:  # heavy pruning must remove paths that matter (not a vacuous bound)
        assert error > 0 and result.dropped_score > 0


def column_ids(head, pruned):
    """Index in `head` of each column of `pruned` (columns are named by units and start)."""
    keys = {(*tuple(c.tolist()), int(s)): k for k, (c, s) in
            enumerate(zip(head.selector.units.t(), head.selector.start, strict=True))}
    return [keys[(*tuple(c.tolist()), int(s))] for c, s in
            zip(pruned.selector.units.t(), pruned.selector.start, strict=True)]


def kept_scores(head, result, scores):
    """Sum of the scores of the kept paths; a column is identified by its (units, start),
    and each kept weight must equal the original's."""
    total = 0.0
    pruned = result.head
    for k, column in enumerate(column_ids(head, pruned)):
        kept = (pruned.weight_mask[:, :, k] if pruned.weight_mask is not None
                else torch.ones_like(scores[:, :, column], dtype=torch.bool))
        if head.weight_mask is not None:
            kept = kept & head.weight_mask[:, :, column]
        total += float(scores[:, :, column][kept].sum())
        assert torch.equal(pruned.weight.detach()[:, :, k][kept],
                           head.weight.detach()[:, :, column][kept])
    return total


def test_norms_are_the_definition():
    head = from_mlp(random_mlp((4, 3, 5, 2), seed=2))
    omega = unseen_inputs(23, 4, seed=3)
    norms = path_norms(head, omega, batch_size=5)  # several chunks
    expected = torch.zeros_like(norms)
    gates = [g for g in head.selector.gates(omega)]
    for x, g in zip(omega, zip(*gates, strict=True), strict=True):
        x_aug = torch.cat([x, torch.ones(1, dtype=x.dtype)])
        for s in range(head.paths):
            ind = 1.0
            for layer in range(2):
                unit = int(head.selector.units[layer, s])
                if unit < len(g[layer]):
                    ind *= float(g[layer][unit])
            expected[:, s] += x_aug.abs() * ind
    torch.testing.assert_close(norms, expected / len(omega), rtol=1e-12, atol=0)


def test_remark5_a_budget_above_the_paths_keeps_everything():
    mlp = random_mlp((5, 6, 2), seed=4)
    head = from_mlp(mlp)
    omega = unseen_inputs(30, 5, seed=5)
    result = prune(head, omega, keep=10 * head.path_count())
    assert result.kept == result.candidates == head.path_count() and result.mu == 1
    assert result.dropped_score == 0
    x = unseen_inputs(9, 5, seed=6)
    with torch.no_grad():
        assert relative_error(result.head(x), mlp(x)) <= 1e-10


def test_structured_keeping_every_unit_is_exact():
    mlp = random_mlp((7, 6, 4, 3), seed=7)
    head = from_mlp(mlp)
    result = prune(head, unseen_inputs(40, 7, seed=8), keep=head.path_count(), structured=True)
    assert result.head.paths == head.paths
    x = unseen_inputs(13, 7, seed=9)
    with torch.no_grad():
        assert relative_error(result.head(x), mlp(x)) <= 1e-10


def test_structured_keeps_whole_columns_and_a_smaller_dense_p():
    head = from_mlp(random_mlp((8, 20, 3), seed=10))
    per_column = 3 * 9
    result = prune(head, unseen_inputs(50, 8, seed=11), keep=5 * per_column + 7,
                   structured=True)
    assert result.head.paths == 5 and result.head.weight_mask is None
    assert result.kept == 5 * per_column
    with pytest.raises(ValueError, match="smaller than one whole path column"):
        prune(head, unseen_inputs(5, 8, seed=1), keep=per_column - 1, structured=True)


def test_columns_with_nothing_kept_are_dropped_exactly():
    head = from_mlp(random_mlp((3, 40, 2), seed=12))
    omega = unseen_inputs(60, 3, seed=13)
    result = prune(head, omega, keep=10)  # at most 10 of the 40 columns can survive
    assert result.head.paths <= 10 and result.kept == 10
    masked = from_mlp(random_mlp((3, 40, 2), seed=12))
    with torch.no_grad():  # the same kept weights on the full 40 columns
        keep = torch.zeros_like(masked.weight, dtype=torch.bool)
        scores = path_scores(masked, omega).flatten()
        keep.view(-1)[scores.topk(10).indices] = True
        masked.weight.masked_fill_(~keep, 0)
        x = unseen_inputs(11, 3, seed=14)
        assert relative_error(result.head(x), masked(x)) <= 1e-12


@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),
    lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, fused=True),
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, weight_decay=1e-2),
], ids=["adam", "adam-fused", "adamw", "sgd-momentum"])
def test_pruned_weights_stay_exactly_zero_through_training(make_optimizer):
    torch.manual_seed(15)
    mlp = random_mlp((10, 16, 4, 3), seed=15, dtype=torch.float32)
    head = from_mlp(mlp)
    x, y = torch.randn(64, 10), torch.randint(0, 3, (64,))
    result = prune(head, x, mu=0.2)
    pruned = result.head
    mask = pruned.weight_mask
    assert mask is not None and 0 < int(mask.sum()) < mask.numel()
    before = pruned.weight.detach().clone()
    optimizer = make_optimizer(pruned.parameters())
    for _ in range(6):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(pruned(x), y).backward()
        optimizer.step()
    after = pruned.weight.detach()
    assert bool((after[~mask] == 0).all())
    assert bool((after[mask] != before[mask]).float().mean() > 0.9)  # the kept ones trained
    assert count_parameters(pruned) == result.kept + 3


def test_mu_rounds_down_and_bad_arguments_are_named():
    head = from_mlp(random_mlp((4, 5, 2), seed=16))
    omega = unseen_inputs(10, 4, seed=17)
    assert prune(head, omega, mu=0.33).kept == int(0.33 * 50)  # 16.5 -> 16
    with pytest.raises(ValueError, match="exactly one of keep"):
        prune(head, omega)
    with pytest.raises(ValueError, match="exactly one of keep"):
        prune(head, omega, keep=3, mu=0.1)
    with pytest.raises(ValueError, match="keep must be a positive int"):
        prune(head, omega, keep=0)
    with pytest.raises(ValueError, match=r"reference must be a non-empty \[N, 4\]"):
        prune(head, omega[:, :3], keep=3)


def test_sampled_threshold_top_equals_full_topk():
    from glai_kernels.glai.prune import _top

    gen = torch.Generator().manual_seed(18)
    flat = torch.rand(5_000_000, generator=gen)
    flat[::7] = 0.5  # many ties below the cut
    values, indices = _top(flat, 3000)
    expected = flat.topk(3000).values
    assert indices.unique().numel() == 3000
    torch.testing.assert_close(values.sort().values, expected.sort().values, rtol=0, atol=0)


def test_a_deep_copied_or_double_forward_head_keeps_its_zeros():
    import copy

    torch.manual_seed(19)
    head = from_mlp(random_mlp((6, 9, 3), seed=19, dtype=torch.float32))
    x = torch.randn(32, 6)
    # the dense layout (its gradient-mask hook is the subject): auto takes sparse at mu = 0.3
    pruned = copy.deepcopy(prune(head, x, mu=0.3, layout="dense").head)  # hooks: re-registered
    mask = pruned.weight_mask
    optimizer = torch.optim.Adam(pruned.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(4):
        optimizer.zero_grad()
        (pruned(x).square().mean() + pruned(x[:5]).abs().mean()).backward()  # two forwards
        optimizer.step()
    assert bool((pruned.weight.detach()[~mask] == 0).all())
    assert bool((pruned.weight.grad[~mask] == 0).all()) and pruned.weight.grad[mask].abs().sum() > 0


def test_loading_a_state_dict_brings_its_mask():
    from glai_kernels.glai import GLAIHead

    full = from_mlp(random_mlp((5, 8, 2), seed=20, dtype=torch.float32))
    gen = torch.Generator().manual_seed(21)
    masks = [torch.rand(full.weight.shape, generator=gen) < 0.5 for _ in range(2)]
    a, b = (GLAIHead(full.selector, full.weight, full.bias, m) for m in masks)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.weight_mask, masks[0])
    b(torch.randn(7, 5)).square().sum().backward()
    assert bool((b.weight.grad[~masks[0]] == 0).all())
    assert b.weight.grad[masks[0]].abs().sum() > 0
