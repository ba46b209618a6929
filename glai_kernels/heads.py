"""The paper's six heads (its Tables 1 and 2; SPEC §3), stated once for tests, benchmarks
and the pipeline.

A head is a one-hidden-layer MLP (n0, n1, n2) on a frozen backbone's embeddings. Its GLAI
estimator comes from the reduced MLP (n0, rho*n1, n2): I = n0 + 1 (a constant-1 input carries
the hidden bias), P = rho*n1, O = n2.
"""

from __future__ import annotations

from dataclasses import dataclass

from glai_kernels.contract import Shape


@dataclass(frozen=True)
class PaperHead:
    """One experiment of the paper: architecture and Table 2's training settings."""

    name: str
    backbone: str
    dataset: str
    n0: int
    n1: int
    n2: int
    lr: float
    batch_size: int
    mlp_weight_decay: float
    glai_weight_decay: float
    reduced_epochs: int
    rho: float = 0.5

    @property
    def family(self) -> str:
        """"A" (supervised), "B" (contrastive) or "C" (few-shot)."""
        return self.name[0]

    @property
    def inputs(self) -> int:
        return self.n0 + 1

    @property
    def paths(self) -> int:
        return round(self.rho * self.n1)

    @property
    def outputs(self) -> int:
        return self.n2

    def shape(self, batch: int) -> Shape:
        """The dense estimator's Shape at this batch size."""
        return Shape(batch, self.inputs, self.paths, self.outputs)


PAPER_HEADS: dict[str, PaperHead] = {h.name: h for h in (
    PaperHead("A1", "DeiT-S/16", "Oxford Pets", 384, 256, 37, 1e-3, 16, 1e-3, 0.1, 20),
    PaperHead("A2", "RoBERTa-base", "DBPedia-14", 768, 128, 4, 1e-3, 16, 1e-3, 0.1, 20),
    PaperHead("B1", "EfficientNet-B0", "STL-10", 1280, 640, 128, 1e-3, 16, 1e-3, 0.1, 60),
    PaperHead("B2", "GPT-2 small", "WikiText-2", 768, 768, 128, 1e-4, 16, 1e-2, 0.1, 2),
    PaperHead("C1", "MobileNetV3-S", "Omniglot", 576, 256, 5, 1e-3, 16, 1e-3, 0.1, 30),
    PaperHead("C2", "XLNet-base", "AGNews", 768, 512, 4, 1e-3, 32, 1e-2, 0.1, 30),
)}
