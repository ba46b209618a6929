"""Presets: how much of the paper's protocol to run.

  quick    CI-sized (about 2 minutes on a 2-core CPU): the six heads at their real sizes,
           3 seeds, tiny synthetic data, epochs capped at 3 and patience at 2, no structured
           variant.
  default  what `nox -s bench` runs (about 2 minutes on an idle 2-core CPU; several times
           that when the machine is shared): the six heads at real sizes, 3 seeds, small
           synthetic data, epoch caps 30 (A), 8 (B), 35 (C) with the paper's patience; digits
           too for A2 and C1.
  full     the paper's settings on a user's machine: larger data, epoch caps of 60 (A, B)
           and 300 (C), the paper's patience, both built-in data sets for every head.
Users' own embeddings replace the built-in data per head (`--data A1=file.npz`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glai_kernels.glai.protocol import Protocol
from glai_kernels.paper_heads import PAPER_HEADS, PaperHead


@dataclass(frozen=True)
class Preset:
    name: str
    heads: tuple[PaperHead, ...]
    seeds: tuple[int, ...]
    protocol: Protocol
    sizes: dict[str, dict[str, int]]  # per family: train/val/test (A, B) or per_class (C)
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)  # head -> data sets

    def sources_for(self, head: PaperHead) -> tuple[str, ...]:
        return self.sources.get(head.name, ("synthetic",))


ALL = tuple(PAPER_HEADS.values())
DIGITS_DEFAULT = ("A2", "C1")  # heads with small estimators: digits too in the default run

PRESETS = {
    "quick": Preset(
        "quick", ALL, (0, 1, 2),
        Protocol(max_epochs=3, max_epochs_b=2, max_epochs_c=3, patience_cap=2, reference_size=256,
                 episodes_per_epoch=5, val_episodes=5, structured=False),
        {"A": {"train": 96, "val": 64, "test": 64}, "B": {"train": 32, "val": 32, "test": 32},
         "C": {"per_class": 16}}),
    "default": Preset(
        "default", ALL, (0, 1, 2),
        Protocol(max_epochs=30, max_epochs_b=8, max_epochs_c=35, reference_size=512,
                 episodes_per_epoch=4, val_episodes=8),
        {"A": {"train": 512, "val": 256, "test": 256},
         "B": {"train": 64, "val": 48, "test": 48}, "C": {"per_class": 20}},
        {name: ("synthetic", "digits") for name in DIGITS_DEFAULT}),
    "full": Preset(
        "full", ALL, (0, 1, 2),
        Protocol(max_epochs=60, max_epochs_b=60, max_epochs_c=300, reference_size=4096,
                 episodes_per_epoch=100, val_episodes=100),
        {"A": {"train": 20000, "val": 5000, "test": 5000},
         "B": {"train": 20000, "val": 5000, "test": 5000}, "C": {"per_class": 30}},
        {name: ("synthetic", "digits") for name in PAPER_HEADS}),
}
