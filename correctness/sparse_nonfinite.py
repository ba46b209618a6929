"""The sparse op's non-finite cases and their float64 oracle, shared by the backends' check
(test_sparse_contract.py) and the CUDA kernels' emulated check (test_sparse_cuda_emulated.py).

Two float64 sums over the kept entries: term by term (v[k] x[b, i_k] act[b, s_k], ...) and
grouped as the layout states the op (act times each group's sum Zg, dy times Zg for dact;
glai_kernels/sparse/reference.py). With an infinite act or dy they may differ (inf · (a + b) is
±inf where inf · a + inf · b is NaN for a, b of opposite signs); a backend may give either
there, and elsewhere exactly their class (NaN, +inf, -inf, finite, then within the dtype's
tolerance).
"""

from __future__ import annotations

import torch

from glai_kernels.sparse import SparsePathWeight, from_dense
from glai_kernels.sparse.reference import backward64, forward64
from reference import tolerance

INF, NAN = float("inf"), float("nan")


def weight(shape=(5, 7, 4), mu=0.6, seed=0, dtype=torch.float32) -> SparsePathWeight:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    return from_dense(w, torch.rand(shape, generator=gen) < mu)


# ---- NaN and Inf ---------------------------------------------------------------------------
# Two float64 sums over the kept entries: term by term (v[k] x[b, i_k] act[b, s_k], ...) and
# grouped as the layout states the op (act times each group's sum Zg, dy times Zg for dact;
# glai_kernels/sparse/reference.py). With an infinite act or dy they may differ (inf · (a + b)
# is ±inf where inf · a + inf · b is NaN for a, b of opposite signs); a backend may give
# either there, and elsewhere exactly their class (NaN, +inf, -inf, finite, then within the
# dtype's tolerance).


def term_sums64(dy, x, act, values, index, absolute=False):
    """(y, dx, dact, dvalues) as float64 sums of one term per kept entry (with `absolute`, of
    the terms' absolute values: the tolerance's scale)."""
    dy, x, act, v = (t.detach().double() for t in (dy, x, act, values))
    if absolute:
        dy, x, act, v = dy.abs(), x.abs(), act.abs(), v.abs()
    o, i, s = index.entries()
    (batch, inputs), paths, outputs = x.shape, act.shape[1], index.shape[0]
    y = x.new_zeros(batch, outputs).index_add_(1, o, v * x[:, i] * act[:, s])
    dx = x.new_zeros(batch, inputs).index_add_(1, i, v * dy[:, o] * act[:, s])
    dact = x.new_zeros(batch, paths).index_add_(1, s, v * dy[:, o] * x[:, i])
    return y, dx, dact, (dy[:, o] * act[:, s] * x[:, i]).sum(0)


def oracles64(x, act, values, index, dy):
    """(terms, grouped, scale) for one case, each (y, dx, dact, dvalues) in float64: the sums
    term by term, the sums grouped as the layout states the op, and the tolerance's scale (the
    absolute terms' sums, non-finite inputs counted as 0)."""
    terms = term_sums64(dy, x, act, values, index)
    grouped = (forward64(x, act, values, index), *backward64(dy, x, act, values, index))
    scale = term_sums64(dy, x.nan_to_num(0, 0, 0), act.nan_to_num(0, 0, 0),
                        values.nan_to_num(0, 0, 0), index, absolute=True)
    return terms, grouped, scale


def assert_as_the_sums(where: str, actual: torch.Tensor, term: torch.Tensor,
                       group: torch.Tensor, size: torch.Tensor, dtype: torch.dtype,
                       finite_values: bool = True) -> bool:
    """Each element of `actual` has the class (NaN, +inf, -inf, finite) of `term` or of
    `group`, and, with `finite_values`, where both are finite it is within the dtype's
    tolerance of `group` on the scale `size`; `where` names the result in a failure. Returns
    whether `group` holds an infinity (the cases' planted values must reach one)."""
    k = kind(actual)
    wrong = (k != kind(term)) & (k != kind(group))
    assert not bool(wrong.any()), f"{where}: {actual[wrong].tolist()}"
    if finite_values:
        finite = (kind(term) == 0) & (kind(group) == 0)
        error = (actual.double() - group).abs()[finite]
        assert bool((error <= tolerance(dtype) * size[finite]).all()), where
    return bool(group.isinf().any())


def short_group_case():
    """(x, act, sw, dy) of the padded rounds' case (issue 40): one kept entry per group, an
    infinite value (group (0, 2)), B = 29 (one partial tile of 32 lanes), everything else
    positive; y[:, 0] and dact[:, 2] are ±inf in the float64 sums, never NaN (checked here)."""
    mask = torch.zeros(3, 1, 3, dtype=torch.bool)
    mask[0, 0, 1] = mask[0, 0, 2] = mask[1, 0, 0] = True
    sw = from_dense(torch.tensor([[[1.0, 2.0, -3.0]], [[4.0, 5.0, 6.0]], [[0.0] * 3]]), mask)
    with torch.no_grad():
        sw.values[1] = INF  # group (0, 2)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(29, 1, generator=gen) + 0.5
    act = torch.rand(29, 3, generator=gen) + 0.5
    dy = torch.rand(29, 3, generator=gen) + 0.5
    return x, act, sw, dy


def assert_short_group_classes(where: str, y: torch.Tensor, dact: torch.Tensor, x, act, sw,
                               dy) -> None:
    """y and dact computed on `short_group_case`'s (x, act, sw, dy) have, element by element,
    the classes (finite, ±inf, NaN) of its float64 sums grouped as the layout states the op,
    whose infinities at y[:, 0] and dact[:, 2] are asserted too; `where` names the run."""
    expected_y = forward64(x, act, sw.values, sw.index)
    expected_dact = backward64(dy, x, act, sw.values, sw.index)[1]
    assert bool(expected_y[:, 0].isinf().all()) and bool(expected_dact[:, 2].isinf().all())
    assert torch.equal(kind(y), kind(expected_y)), f"{where}: y"
    assert torch.equal(kind(dact), kind(expected_dact)), f"{where}: dact"


def kind(t: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 NaN, 2 +inf, 3 -inf."""
    t = t.detach().double()
    return torch.where(t.isnan(), 1, torch.where(t == INF, 2, torch.where(t == -INF, 3, 0)))


def plant(t: torch.Tensor, gen: torch.Generator, specials=(INF, -INF, NAN)) -> None:
    """Put each of `specials` at a random element of `t`, in place."""
    for value in specials:
        t.view(-1)[int(torch.randint(t.numel(), (1,), generator=gen))] = value


def nonfinite_case(seed: int, batch: int, dtype: torch.dtype):
    """(x, act, sw, dy) with inf, -inf and NaN planted in x, act and the values, and an act of
    exactly 0 beside an infinite x."""
    gen = torch.Generator().manual_seed(seed)
    sw = weight(seed=seed, dtype=dtype)
    _, inputs, paths = sw.shape
    x = torch.randn(batch, inputs, generator=gen, dtype=torch.float64).to(dtype)
    act = (torch.rand(batch, paths, generator=gen, dtype=torch.float64) + 0.25).to(dtype)
    dy = torch.randn(batch, sw.shape[0], generator=gen, dtype=torch.float64).to(dtype)
    plant(x, gen)
    plant(act, gen, (INF, NAN, 0.0))
    with torch.no_grad():
        plant(sw.values, gen)
    return x, act, sw, dy
