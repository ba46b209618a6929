"""The GLAI method around the estimator op (SPEC §4; the paper's Sections 3-4).

    head = glai_kernels.from_mlp(mlp)            # exact: head(x) == mlp(x) (Theorem 1)
    kept = prune(head, x_ref, keep=budget.keep)  # path-norm pruning (Theorem 2)

Modules: `mlp` (accepted MLP form, reduced MLPs), `selector` (frozen path selector), `convert`
(exact conversion), `head` (GLAIHead), `prune`, `matching` (μ from ρ by real parameter
counts), `convergence` (path distance m_t, the switch to the estimator).
"""

from glai_kernels.glai.convergence import (
    FIXED_FRACTIONS,
    StructureMonitor,
    fixed_reduced_epochs,
    path_activations,
    path_distance,
)
from glai_kernels.glai.convert import from_mlp, path_weights
from glai_kernels.glai.head import GLAIHead
from glai_kernels.glai.matching import Budget, count_parameters, match, path_budget
from glai_kernels.glai.mlp import MLPLayers, make_mlp, parse_mlp, reduce_mlp, reduced_widths
from glai_kernels.glai.prune import PruneResult, path_norms, path_scores, prune
from glai_kernels.glai.selector import PathSelector, all_paths

__all__ = [
    "FIXED_FRACTIONS",
    "Budget",
    "GLAIHead",
    "MLPLayers",
    "PathSelector",
    "PruneResult",
    "StructureMonitor",
    "all_paths",
    "count_parameters",
    "fixed_reduced_epochs",
    "from_mlp",
    "make_mlp",
    "match",
    "parse_mlp",
    "path_activations",
    "path_budget",
    "path_distance",
    "path_norms",
    "path_scores",
    "path_weights",
    "prune",
    "reduce_mlp",
    "reduced_widths",
]
