"""The embeddings a head trains on: frozen-backbone outputs [N, n0] per split.

The protocol (glai_kernels/glai/protocol.py) takes them in this container;
bench/pipeline/data.py loads users' files and makes the built-in data sets into it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

SPLITS = ("train", "val", "test")


@dataclass
class EmbeddingSplits:
    """x_* [N, n0] float32 and y_* [N] int64 (None when unlabeled) per split."""

    x: dict[str, torch.Tensor]
    y: dict[str, torch.Tensor | None]
    name: str
    description: str
    classes: dict[str, list[int]] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return self.x["train"].shape[1]
