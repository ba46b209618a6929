"""The kept-path layout and `SparsePathWeight`: every documented invariant of the index
tensors, the exact round trip, moves, state dicts, and errors that name the argument."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glai_kernels.sparse import KeptIndex, SparsePathWeight, build_index, from_dense, from_entries
from glai_kernels.sparse.reference import backward64, forward64
from reference import forward64 as dense_forward64
from reference import grads64


def masked(shape, mu, seed=0, empty_output=None):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(*shape, generator=gen)
    mask = torch.rand(*shape, generator=gen) < mu
    if empty_output is not None:
        mask[empty_output] = False
    return weight, mask


def check_layout(index: KeptIndex, mask: torch.Tensor) -> None:
    """Every statement of layout.py's docstring, checked from scratch."""
    out_count, in_count, path_count = mask.shape
    assert index.shape == tuple(mask.shape) and index.nnz == int(mask.sum())
    for t in index:
        assert t.dtype == torch.int32 and t.is_contiguous()
    o, i, s = index.entries()
    keys = (o * path_count + s) * in_count + i
    assert bool((keys[1:] > keys[:-1]).all())  # sorted by (o, s, i), unique
    assert bool(mask[o, i, s].all())
    ptr = index.group_ptr.long()
    assert int(ptr[0]) == 0 and int(ptr[-1]) == index.nnz and bool((ptr[1:] > ptr[:-1]).all())
    for g in range(index.groups):
        members = range(int(ptr[g]), int(ptr[g + 1]))
        assert {(int(o[k]), int(s[k])) for k in members} == {
            (int(index.group_outputs[g]), int(index.group_paths[g]))}
        assert all(int(index.entry_groups[k]) == g for k in members)
    group_keys = index.group_outputs.long() * path_count + index.group_paths.long()
    assert bool((group_keys[1:] > group_keys[:-1]).all())  # one group per (o, s), in order
    optr = index.output_ptr.long()
    for out in range(out_count):
        assert bool((index.group_outputs[int(optr[out]):int(optr[out + 1])] == out).all())
    assert int(optr[-1]) == index.groups
    iptr = index.input_ptr.long()
    for inp in range(in_count):
        ks = index.input_entries[int(iptr[inp]):int(iptr[inp + 1])].long()
        assert bool((i[ks] == inp).all()) and bool((ks[1:] > ks[:-1]).all())
    assert int(iptr[-1]) == index.nnz
    pptr = index.path_ptr.long()
    for path in range(path_count):
        gs = index.path_groups[int(pptr[path]):int(pptr[path + 1])].long()
        assert bool((index.group_paths[gs] == path).all()) and bool((gs[1:] > gs[:-1]).all())
    assert int(pptr[-1]) == index.groups


CASES = {"K0": ((3, 4, 5), 0.0), "mu10": ((5, 7, 6), 0.1), "mu50": ((4, 9, 3), 0.5),
         "all": ((3, 5, 4), 1.01), "O1-P1": ((1, 6, 1), 0.5)}


@pytest.mark.parametrize("shape,mu", CASES.values(), ids=CASES.keys())
def test_layout_invariants_and_round_trip(shape, mu):
    weight, mask = masked(shape, mu, empty_output=0 if shape[0] > 1 else None)
    sw = from_dense(weight, mask)
    check_layout(sw.index, mask)
    assert sw.shape == shape and sw.nnz == int(mask.sum())
    assert torch.equal(sw.to_dense(), weight * mask)
    assert torch.equal(sw.mask(), mask)
    assert torch.equal(build_index(mask).inputs, sw.inputs)


def test_reference_passes_match_the_dense_oracle():
    weight, mask = masked((6, 8, 5), 0.3, seed=3, empty_output=2)
    sw = from_dense(weight, mask)
    gen = torch.Generator().manual_seed(4)
    x, act, dy = (torch.randn(*s, generator=gen, dtype=torch.float64)
                  for s in ((7, 8), (7, 5), (7, 6)))
    dense = sw.to_dense()
    torch.testing.assert_close(forward64(x, act, sw.values, sw.index),
                               dense_forward64(x, act, dense), rtol=0, atol=1e-13)
    dx, dact, dvalues = backward64(dy, x, act, sw.values, sw.index)
    expected = grads64(dy, x, act, dense)
    torch.testing.assert_close(dx, expected.x, rtol=0, atol=1e-13)
    torch.testing.assert_close(dact, expected.act, rtol=0, atol=1e-13)
    torch.testing.assert_close(dvalues, expected.weight[sw.entries()], rtol=0, atol=1e-13)


def test_from_entries_any_order_matches_from_dense():
    weight, mask = masked((4, 6, 5), 0.4, seed=5)
    sw = from_dense(weight, mask)
    o, i, s = sw.entries()
    perm = torch.randperm(sw.nnz, generator=torch.Generator().manual_seed(0))
    other = from_entries(o[perm], i[perm].int(), s[perm], sw.values.detach()[perm], sw.shape)
    assert torch.equal(other.values, sw.values)
    for a, b in zip(other.index, sw.index, strict=True):
        assert torch.equal(a, b)


def test_to_and_state_dict_round_trip():
    weight, mask = masked((3, 5, 4), 0.5, seed=6)
    sw = from_dense(weight, mask).to(torch.float64)
    assert sw.values.dtype == torch.float64 and sw.inputs.dtype == torch.int32
    assert isinstance(sw.values, torch.nn.Parameter) and sw.values.requires_grad
    buffer = io.BytesIO()
    torch.save(sw.state_dict(), buffer)
    buffer.seek(0)
    loaded = SparsePathWeight.empty((3, 5, 4), dtype=torch.float64)
    loaded.load_state_dict(torch.load(buffer))
    assert torch.equal(loaded.to_dense(), sw.to_dense())
    assert loaded.nnz == sw.nnz and [n for n, _ in loaded.named_parameters()] == ["values"]
    for a, b in zip(loaded.index, sw.index, strict=True):
        assert torch.equal(a, b)


def test_to_dense_is_differentiable_in_values():
    weight, mask = masked((2, 3, 4), 0.5, seed=7)
    sw = from_dense(weight, mask)
    (sw.to_dense() * torch.arange(24.0).view(2, 3, 4)).sum().backward()
    assert torch.equal(sw.values.grad, torch.arange(24.0).view(2, 3, 4)[sw.entries()])


W, M = masked((2, 3, 4), 0.5)
O_, I_, S_ = from_dense(W, M).entries()
V_ = W[O_, I_, S_]
ERRORS = {
    "mask dtype": (lambda: from_dense(W, M.float()), TypeError, r"mask must have dtype torch.bool"),
    "mask shape": (lambda: from_dense(W, M[:1]), ValueError,
                   r"mask must have weight's shape \[2, 3, 4\], got \[1, 3, 4\]"),
    "mask device": (lambda: from_dense(W, M.to("meta")), ValueError, r"mask must be on weight's"),
    "weight rank": (lambda: from_dense(W[0], M[0]), ValueError, r"weight must be a 3-d tensor"),
    "weight dtype": (lambda: from_dense(W.int(), M), TypeError, r"weight must have a floating"),
    "index out of range": (lambda: from_entries(O_, I_ + 3, S_, V_, (2, 3, 4)), ValueError,
                           r"inputs index out of range.*\[0, 3\)"),
    "negative index": (lambda: from_entries(O_ - 1, I_, S_, V_, (2, 3, 4)), ValueError,
                       r"outputs index out of range"),
    "duplicate": (lambda: from_entries(torch.cat([O_, O_[:1]]), torch.cat([I_, I_[:1]]),
                                       torch.cat([S_, S_[:1]]), torch.cat([V_, V_[:1]]),
                                       (2, 3, 4)), ValueError, r"duplicate entries"),
    "values length": (lambda: from_entries(O_, I_, S_, V_[:-1], (2, 3, 4)), ValueError,
                      r"values and indices must have the same length"),
    "index lengths": (lambda: from_entries(O_, I_[:-1], S_, V_, (2, 3, 4)), ValueError,
                      r"inputs has .* must have the same length"),
    "float index": (lambda: from_entries(O_, I_.float(), S_, V_, (2, 3, 4)), TypeError,
                    r"inputs must be a 1-d integer tensor"),
}


@pytest.mark.parametrize("make,error,message", ERRORS.values(), ids=ERRORS.keys())
def test_bad_construction_is_named(make, error, message):
    with pytest.raises(error, match=message):
        make()


@settings(max_examples=40, deadline=None)
@given(st.tuples(*[st.integers(1, 6)] * 3), st.floats(0.0, 1.0), st.integers(0, 2**16))
def test_layout_of_any_mask(shape, mu, seed):
    """Every documented invariant and the round trip, for random shapes and kept fractions."""
    weight, mask = masked(shape, mu, seed=seed)
    sw = from_dense(weight, mask)
    check_layout(sw.index, mask)
    assert torch.equal(sw.to_dense(), weight * mask)
    o, i, s = sw.entries()
    perm = torch.randperm(sw.nnz, generator=torch.Generator().manual_seed(seed))
    again = from_entries(o[perm], i[perm], s[perm], sw.values.detach()[perm], shape)
    assert torch.equal(again.to_dense(), sw.to_dense())
