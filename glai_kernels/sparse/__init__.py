"""The sparse kept-path estimator: the pruned estimator at a cost that follows the K kept
path weights instead of all O·I·P (docs/ARCHITECTURE.md).

    sw = glai_kernels.sparse.from_dense(weight, mask)        # values [K] + index (layout.py)
    y = glai_kernels.sparse.estimator(x, act, sw, bias=None, backend=None)
    y[b, o] = sum_{kept (o, i, s)} sw[o, i, s] * x[b, i] * act[b, s] + bias[o]

`sw.shape == (O, I, P)`, `sw.nnz == K`, `sw.to_dense()` is the [O, I, P] weight; train
`sw.values`. Backends (`glai_kernels.sparse.backends()`) are chosen by `backend=`, else
$GLAI_BACKEND, else "auto", as for the dense op (`Registry.resolve`; "auto" follows the
machine's `glai_kernels/dispatch/<machine kind>.sparse_estimator.json` where one is shipped).

Modules: `layout` (the index tensors, documented for kernel writers), `weight`
(`SparsePathWeight`), `contract` (argument checks), `checked` (the indices already validated,
remembered, each with what the last eager call with it found), `registry` (`SPARSE_ESTIMATOR`
and the backend signatures), `op` (the custom ops, on the core both ops share:
glai_kernels/calls.py),
`backends/` (one file per backend), `reference` (the passes over the layout in float64).
"""

from glai_kernels.registry import BackendStatus
from glai_kernels.sparse import backends as _backend_modules  # noqa: F401  (registers them)
from glai_kernels.sparse.layout import KeptIndex, build_index, index_from_entries
from glai_kernels.sparse.op import estimator
from glai_kernels.sparse.registry import SPARSE_ESTIMATOR, SparseShape
from glai_kernels.sparse.weight import SparsePathWeight, from_dense, from_entries


def backends() -> list[BackendStatus]:
    """Every registered sparse backend, where it is available and why not elsewhere."""
    return SPARSE_ESTIMATOR.statuses()


__all__ = [
    "SPARSE_ESTIMATOR",
    "KeptIndex",
    "SparsePathWeight",
    "SparseShape",
    "backends",
    "build_index",
    "estimator",
    "from_dense",
    "from_entries",
    "index_from_entries",
]
