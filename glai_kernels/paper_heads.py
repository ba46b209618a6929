"""The paper's six heads (its Table 1; docs/ARCHITECTURE.md), stated once for tests,
benchmarks and the GLAI protocol. Their training settings (Table 2) are
glai_kernels/glai/paper_training.py.

A head is a one-hidden-layer MLP (n0, n1, n2) on a frozen backbone's embeddings. Its GLAI
estimator comes from the reduced MLP (n0, rho*n1, n2): I = n0 + 1 (a constant-1 input carries
the hidden bias), P = rho*n1, O = n2.
"""

from __future__ import annotations

from dataclasses import dataclass

from glai_kernels.contract import Shape


@dataclass(frozen=True)
class PaperHead:
    """One experiment of the paper: backbone, data set and the head's architecture."""

    name: str
    backbone: str
    dataset: str
    n0: int
    n1: int
    n2: int
    rho: float = 0.5

    @property
    def family(self) -> str:
        """"A" (supervised), "B" (contrastive) or "C" (few-shot)."""
        return self.name[0]

    @property
    def paper_name(self) -> str:
        """The paper's name for this head: scaled test copies are named e.g. "A1-tiny"."""
        return self.name.split("-")[0]

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
    PaperHead("A1", "DeiT-S/16", "Oxford Pets", 384, 256, 37),
    PaperHead("A2", "RoBERTa-base", "DBPedia-14", 768, 128, 4),
    PaperHead("B1", "EfficientNet-B0", "STL-10", 1280, 640, 128),
    PaperHead("B2", "GPT-2 small", "WikiText-2", 768, 768, 128),
    PaperHead("C1", "MobileNetV3-S", "Omniglot", 576, 256, 5),
    PaperHead("C2", "XLNet-base", "AGNews", 768, 512, 4),
)}
