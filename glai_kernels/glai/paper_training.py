"""The paper's training settings per head (its Table 2 and Section 4.1), used by the protocol
(glai_kernels/glai/protocol.py). The heads' shapes are glai_kernels/paper_heads.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from glai_kernels.paper_heads import PaperHead

INFO_NCE_TEMPERATURE = 0.07  # family B's contrastive loss, every head


@dataclass(frozen=True)
class PaperTraining:
    """How the paper trains one head.

    lr, batch_size: SGD for the MLPs and the linear head, Adam for the estimator (same LR);
    mlp_weight_decay / glai_weight_decay: the MLPs' and the estimator's;
    reduced_epochs: Table 2's reduced-MLP epochs (the protocol uses the fixed fractions of
        the original's epochs instead, glai_kernels.glai.fixed_reduced_epochs);
    patience, min_delta: early stopping, on accuracy in % (A, C) or the InfoNCE loss (B);
    dropout: after the hidden layer (family B), before the linear head's Linear;
    episode: (way, shot, query) of family C's few-shot episodes;
    temperature: family B's InfoNCE temperature.
    """

    lr: float
    batch_size: int
    mlp_weight_decay: float
    glai_weight_decay: float
    reduced_epochs: int
    patience: int
    min_delta: float
    dropout: float = 0.0
    episode: tuple[int, int, int] | None = None
    temperature: float = INFO_NCE_TEMPERATURE


PAPER_TRAINING: dict[str, PaperTraining] = {
    "A1": PaperTraining(1e-3, 16, 1e-3, 0.1, 20, patience=5, min_delta=0.1),
    "A2": PaperTraining(1e-3, 16, 1e-3, 0.1, 20, patience=5, min_delta=0.1),
    "B1": PaperTraining(1e-3, 16, 1e-3, 0.1, 60, patience=5, min_delta=1e-5, dropout=0.2),
    "B2": PaperTraining(1e-4, 16, 1e-2, 0.1, 2, patience=5, min_delta=0.01, dropout=0.4),
    "C1": PaperTraining(1e-3, 16, 1e-3, 0.1, 30, patience=30, min_delta=1.0, episode=(5, 4, 6)),
    "C2": PaperTraining(1e-3, 32, 1e-2, 0.1, 30, patience=30, min_delta=1.0,
                        episode=(5, 5, 10)),
}


def paper_training(head: PaperHead) -> PaperTraining:
    """The settings of `head`'s paper head (a scaled copy "A1-tiny" trains as A1)."""
    return PAPER_TRAINING[head.paper_name]
