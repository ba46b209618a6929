"""The GLAI method around the estimator op (docs/ARCHITECTURE.md; the paper's Sections 3-4).

    head = glai_kernels.from_mlp(mlp)            # exact: head(x) == mlp(x) (Theorem 1)
    kept = prune(head, x_ref, keep=budget.keep)  # path-norm pruning (Theorem 2)
    records = run_head(PAPER_HEADS["A1"], data, seed, Protocol())  # the paper's protocol

Modules: `mlp` (accepted MLP form, reduced MLPs), `selector` (frozen path selector), `convert`
(exact conversion), `head` (GLAIHead), `prune`, `matching` (μ from ρ by real parameter
counts), `convergence` (path distance m_t, the switch to the estimator). Training:
`tasks` (classification, InfoNCE), `episodes` (few-shot), `training` (the loop, early
stopping), `embeddings` (the data a head trains on), `paper_training` (the paper's per-head
settings), `timing` (per-epoch costs from interleaved repeats, robust to a shared machine)
and `protocol` (every model of the paper's Table 3 for one head, data set, seed).
"""

from glai_kernels.glai.convergence import (
    FIXED_FRACTIONS,
    StructureMonitor,
    fixed_reduced_epochs,
    path_activations,
    path_distance,
)
from glai_kernels.glai.convert import from_mlp, path_weights
from glai_kernels.glai.embeddings import EmbeddingSplits
from glai_kernels.glai.episodes import FewShot
from glai_kernels.glai.fused_step import FusedSparseStep
from glai_kernels.glai.head import GLAIHead
from glai_kernels.glai.matching import Budget, count_parameters, match, path_budget
from glai_kernels.glai.mlp import MLPLayers, make_mlp, parse_mlp, reduce_mlp, reduced_widths
from glai_kernels.glai.paper_training import PAPER_TRAINING, PaperTraining, paper_training
from glai_kernels.glai.protocol import MODELS, SWITCHES, Protocol, run_head
from glai_kernels.glai.prune import PruneResult, path_norms, path_scores, prune
from glai_kernels.glai.selector import PathSelector, all_paths
from glai_kernels.glai.tasks import Classification, Contrastive, Task, info_nce, two_views
from glai_kernels.glai.timing import Cost, interleaved, training_probe
from glai_kernels.glai.training import EarlyStopping, FitResult, fit, make_optimizer

__all__ = [
    "FIXED_FRACTIONS",
    "MODELS",
    "PAPER_TRAINING",
    "SWITCHES",
    "Budget",
    "Classification",
    "Contrastive",
    "Cost",
    "EarlyStopping",
    "EmbeddingSplits",
    "FewShot",
    "FitResult",
    "FusedSparseStep",
    "GLAIHead",
    "MLPLayers",
    "PaperTraining",
    "PathSelector",
    "Protocol",
    "PruneResult",
    "StructureMonitor",
    "Task",
    "all_paths",
    "count_parameters",
    "fit",
    "fixed_reduced_epochs",
    "from_mlp",
    "info_nce",
    "interleaved",
    "make_mlp",
    "make_optimizer",
    "match",
    "paper_training",
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
    "run_head",
    "training_probe",
    "two_views",
]
