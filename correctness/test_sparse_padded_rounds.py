"""The `cpp` one-vector forward's last round of a group reads four whole entries from where the
group's whole rounds end, the ones past the group's end under a mask (sparse_kernels.inc,
padded_round), and dvalues' last round eight (hsum8), their results for entries past the group
overwritten by the later groups. An entry past a group's end must never reach that group: a NaN
value in the first entry of every other group leaves the other groups' sums finite and equal to
the float64 oracle's, at every group size 1-20 (every remainder of a round of four and eight).

B = 13 (float32 with AVX-512: one vector of 16 lanes, three padding lanes)."""

from __future__ import annotations

import itertools

import pytest
import torch

from glai_kernels.sparse import from_dense

BATCH, OUTPUTS, INPUTS, PATHS = 13, 5, 40, 8


def _problem(seed):
    """(x [B, I], act [B, P], values [K], index, dy [B, O]): group (o, s) keeps
    1 + (o·P + s) mod 20 inputs, chosen at random, so the group sizes run 1-20."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(OUTPUTS, INPUTS, PATHS, dtype=torch.bool)
    for o in range(OUTPUTS):
        for s in range(PATHS):
            keep = 1 + (o * PATHS + s) % 20
            mask[o, torch.randperm(INPUTS, generator=gen)[:keep], s] = True
    sw = from_dense(torch.randn(OUTPUTS, INPUTS, PATHS, generator=gen), mask)
    x = torch.randn(BATCH, INPUTS, generator=gen)
    act = torch.rand(BATCH, PATHS, generator=gen)
    dy = torch.randn(BATCH, OUTPUTS, generator=gen)
    return x, act, sw.values.detach().clone(), list(sw.index), dy


def _group_sums(x, values, index):
    """Zg [G, B] in float64: each group's sum of v_k x[:, i_k]."""
    inputs_of, group_ptr = index[0].long(), index[1].long()
    terms = values.double()[:, None] * x.double().T[inputs_of]  # [K, B]
    return torch.stack([terms[a:b].sum(0) for a, b in itertools.pairwise(group_ptr.tolist())])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_nan_after_a_group_never_reaches_it(built, seed):
    x, act, values, index, _ = _problem(seed)
    group_ptr = index[1].long()
    sizes = torch.diff(group_ptr)
    assert set(range(1, 21)) <= set(sizes.tolist())
    poisoned = torch.arange(1, len(sizes), 2)  # every other group: its first entry's value NaN
    values[group_ptr[poisoned]] = float("nan")
    _, zg = torch.ops.glai_ext.sparse_forward(x, act, values, index, True)
    zg = zg[:, :BATCH].double()  # [G, ld] -> [G, B]
    clean = torch.ones(len(sizes), dtype=torch.bool)
    clean[poisoned] = False
    assert torch.isnan(zg[poisoned]).all(dim=1).all()
    torch.testing.assert_close(zg[clean], _group_sums(x, values, index)[clean], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_every_group_size_matches_the_oracle(built, seed):
    """Zg and y of the saving forward (the group form), y alone (flat here: ≈ 10 entries a
    group) and dv, against float64."""
    x, act, values, index, dy = _problem(seed)
    y, zg = torch.ops.glai_ext.sparse_forward(x, act, values, index, True)
    y_alone, _ = torch.ops.glai_ext.sparse_forward(x, act, values, index, False)
    group_sums = _group_sums(x, values, index)  # [G, B]
    torch.testing.assert_close(zg[:, :BATCH].double(), group_sums, rtol=1e-5, atol=1e-5)
    group_outputs, group_paths = index[2].long(), index[3].long()
    exact = torch.zeros(BATCH, OUTPUTS, dtype=torch.float64)
    exact.index_add_(1, group_outputs, (act.double()[:, group_paths] * group_sums.T))
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_alone.double(), exact, rtol=1e-5, atol=1e-5)
    dv = torch.ops.glai_ext.sparse_backward(dy, x, act, values, index, x.new_empty(0),
                                            [False, False, True])[2]
    entry_groups = index[7].long()
    a = dy.double()[:, group_outputs] * act.double()[:, group_paths]  # [B, G]
    exact_dv = (a[:, entry_groups] * x.double()[:, index[0].long()]).sum(0)
    torch.testing.assert_close(dv.double(), exact_dv, rtol=1e-5, atol=1e-5)
