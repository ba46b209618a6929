"""The sparse kept-path estimator: the pruned estimator at a cost that follows the K kept
path weights instead of all O·I·P (docs/ARCHITECTURE.md).

    sw = glai_kernels.sparse.from_dense(weight, mask)   # values [K] + index (layout.py)
    sw.shape == (O, I, P); sw.nnz == K; sw.to_dense()

Modules: `layout` (the index tensors, documented for kernel writers), `weight`
(`SparsePathWeight`), `reference` (the passes over the layout in float64).
"""

from glai_kernels.sparse.layout import KeptIndex, build_index, index_from_entries
from glai_kernels.sparse.weight import SparsePathWeight, from_dense, from_entries

__all__ = [
    "KeptIndex",
    "SparsePathWeight",
    "build_index",
    "from_dense",
    "from_entries",
    "index_from_entries",
]
