"""The `cpp` sparse kernels check each call's groups once, then run a group loop without
checks (sparse_kernels.inc, groups_ok / outputs_ok): an index that fails that pass must still
be refused, and the loop without checks must still check the entries' inputs.

The groups here are long (40 entries a group), so the forward of y alone takes the per-group
form, not the flat one, at one and at three vectors of batch."""

from __future__ import annotations

import pytest
import torch
from sparse_checker import sparse_problem

from glai_kernels.sparse.layout import KeptIndex

INPUTS, PATHS, OUTPUTS = 40, 2, 3  # every path kept: K = 240 entries in G = 6 groups of 40


def _problem(batch):
    x, act, values, index, dy = sparse_problem(batch, INPUTS, PATHS, OUTPUTS, 1.0, seed=3)
    assert values.numel() == INPUTS * PATHS * OUTPUTS and index[2].numel() == PATHS * OUTPUTS
    return x, act, values, index, dy


def _edited(index, field, position, value):
    changed = [t.clone() for t in index]
    changed[KeptIndex._fields.index(field)][position] = value
    return changed


def _forward(x, act, values, index, save):
    return torch.ops.glai_ext.sparse_forward(x, act, values, index, save)


def _dvalues(x, act, values, index, dy):
    return torch.ops.glai_ext.sparse_backward(dy, x, act, values, index, x.new_empty(0),
                                              [False, False, True])


BATCHES = [16, 33]  # float32 AVX-512: one vector, three


@pytest.mark.parametrize("batch", BATCHES)
def test_good_index_runs(built, batch):
    x, act, values, index, dy = _problem(batch)
    y, _ = _forward(x, act, values, index, False)
    y_saved, _ = _forward(x, act, values, index, True)
    assert torch.equal(y, y_saved)
    dv = _dvalues(x, act, values, index, dy)[2]
    assert dv.shape == values.shape and torch.isfinite(dv).all()


# inputs_of[k] just past INPUTS in the middle of the last output's entries: every group offset
# and path stays valid, so the pass over the groups finds nothing and only the loop's own
# check of the inputs can refuse it (it would read the row after x^T's last)
BAD_INPUT = ("inputs", 5 * 40 + 17, INPUTS)
# group 1 ends before it starts, every offset inside [0, K]
DECREASING = ("group_ptr", 2, 39)
# the last group's path one past PATHS
BAD_PATH = ("group_paths", 5, PATHS)
# the first group's output one past OUTPUTS (dvalues reads it; the forward does not)
BAD_OUTPUT = ("group_outputs", 0, OUTPUTS)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("edit", [BAD_INPUT, DECREASING, BAD_PATH],
                         ids=["input", "decreasing", "path"])
@pytest.mark.parametrize("save", [False, True], ids=["y", "saving"])
def test_forward_refuses(built, batch, edit, save):
    x, act, values, index, _ = _problem(batch)
    with pytest.raises(RuntimeError, match="the index is corrupt"):
        _forward(x, act, values, _edited(index, *edit), save)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("edit", [BAD_INPUT, DECREASING, BAD_PATH, BAD_OUTPUT],
                         ids=["input", "decreasing", "path", "output"])
def test_dvalues_refuses(built, batch, edit):
    x, act, values, index, dy = _problem(batch)
    with pytest.raises(RuntimeError, match="the index is corrupt"):
        _dvalues(x, act, values, _edited(index, *edit), dy)
