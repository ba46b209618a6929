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
