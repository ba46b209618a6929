"""Presets: how much of the paper's protocol to run.

  quick    CI-sized (a minute or two on a 2-core CPU): the six heads at their real sizes,
           3 seeds, tiny synthetic data, epochs capped at 3 and patience at 2, no structured
           variant, short cost probes, no torch.compile'd MLP step (the engineered protocol's
           MLPs take the hand-fused step). Checks the machinery, measures nothing.
  first-run  what `nox -s bench` runs (its first-run preset, sized with the kernel suite for
           about 15 minutes on 2 CPU cores as fast as an AMD Zen 5; on a slower machine
           `nox -s bench`'s time limit leaves out later seeds' units, named in the report:
           bench/pipeline/runner.py, `launch_order`): the default preset's data, seeds,
           epoch caps and early stopping, both switches and both protocols, but no structured
           comparison row, 3 interleaved probe rounds of 16 steps (default: 7 of 32), and no
           torch.compile'd MLP step (the engineered protocol's MLPs take the hand-fused step).
  default  `glai-bench pipeline`'s and the long kernel preset's (`nox -s bench -- --preset
           long`): the six heads at real sizes on synthetic data, 2 seeds,
           early stopping decides (epoch caps 150 (A: the A1 MLP was still improving at 60),
           300 (B: B1 seed 1's MLP needs 282 epochs to meet the paper's min delta of 1e-5 on
           the InfoNCE loss, its reduced MLPs 182-189), 200 (C), at least the paper's epochs
           to convergence, with the paper's patience and min delta), 4,096 training
           embeddings for A and B (256 steps of batch 16 per epoch), 50 episodes per epoch for
           C; both switches (fixed fractions and m_t) and the structured comparison row. It
           runs 2 seeds (not 3): the one-sided Wilcoxon tests then pair 6 heads x 2 seeds = 12
           (head, seed) pairs, where p < 0.05 holds with up to three of the smallest
           differences against (with one seed, 6 pairs, two of the smallest against already
           give p = 0.078); it leaves digits to `full`, to stay near the 15-minute target (its
           CPU time per head: docs/notes/pipeline.md, "Reproduction stability (issue 14)").
  full     the paper's settings on a user's machine: larger data, epoch caps of 100 (A, B)
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
    # the progress bar's prior (bench/harness/progress.py): seconds of one unit's process per
    # unit of `bench.pipeline.runner.unit_cost`, measured on this project's 2-core CPU; the
    # rate measured as units finish outweighs it as they do (bench/harness/progress.py,
    # PRIOR_SHARE; None: no estimate until the first finishes)
    seconds_per_cost: float | None = None
    # the bar's measured costs where the preset has them (bench.pipeline.runner.bar_costs):
    # {(head name, seed): wall seconds of that unit on synthetic data}, measured two units at
    # a time on this project's 2-core CPU (a seed sets the epochs early stopping ends at: B1's
    # two differ 2x); they replace unit_cost on the bar, not in the shards' split
    unit_seconds: dict[tuple[str, int], float] | None = None

    def sources_for(self, head: PaperHead) -> tuple[str, ...]:
        return self.sources.get(head.name, ("synthetic",))


ALL = tuple(PAPER_HEADS.values())

PRESETS = {
    "quick": Preset(
        "quick", ALL, (0, 1, 2),
        Protocol(max_epochs=3, max_epochs_b=2, max_epochs_c=3, patience_cap=2, reference_size=256,
                 episodes_per_epoch=5, val_episodes=5, structured=False, timing_repeats=2,
                 probe_steps=4, compile_mlp=False),
        {"A": {"train": 96, "val": 64, "test": 64}, "B": {"train": 32, "val": 32, "test": 32},
         "C": {"per_class": 16}}),
    "first-run": Preset(
        "first-run", ALL, (0, 1),
        Protocol(max_epochs=150, max_epochs_b=300, max_epochs_c=200, reference_size=1024,
                 episodes_per_epoch=50, val_episodes=50, structured=False, timing_repeats=3,
                 probe_steps=16, compile_mlp=False),
        {"A": {"train": 4096, "val": 1024, "test": 256},
         "B": {"train": 4096, "val": 512, "test": 256}, "C": {"per_class": 20}},
        # a fresh clone's `nox -s bench` on a quiet 2-core AMD Zen 5: the twelve units, 4.38e12
        # of unit_cost, in 275 s two at a time (docs/notes/benchmarks.md, "The bars' estimates
        # on a quiet first run (stop 51)"; 4.6e-10, from a loaded run of older code, had the
        # bar open at 16 min 47 s); a loaded machine is slower, and the measured rate takes
        # over as units end
        seconds_per_cost=1.26e-10,
        # each unit's wall seconds in the same kind of run (2026-11-28 10:59, results.json's
        # units.seconds, 285 s in all): what the bar weighs the units by
        unit_seconds={("A1", 0): 15.7, ("A1", 1): 16.9, ("A2", 0): 6.3, ("A2", 1): 6.3,
                      ("B1", 0): 121.8, ("B1", 1): 244.3, ("B2", 0): 36.2, ("B2", 1): 36.1,
                      ("C1", 0): 12.9, ("C1", 1): 12.8, ("C2", 0): 22.9, ("C2", 1): 25.2}),
    "default": Preset(
        "default", ALL, (0, 1),
        Protocol(max_epochs=150, max_epochs_b=300, max_epochs_c=200, reference_size=1024,
                 episodes_per_epoch=50, val_episodes=50, timing_repeats=7, probe_steps=32),
        {"A": {"train": 4096, "val": 1024, "test": 256},
         "B": {"train": 4096, "val": 512, "test": 256}, "C": {"per_class": 20}}),
    "full": Preset(
        "full", ALL, (0, 1, 2),
        Protocol(max_epochs=100, max_epochs_b=100, max_epochs_c=300, reference_size=4096,
                 episodes_per_epoch=100, val_episodes=100, timing_repeats=5, probe_steps=128),
        {"A": {"train": 20000, "val": 5000, "test": 5000},
         "B": {"train": 20000, "val": 5000, "test": 5000}, "C": {"per_class": 30}},
        {name: ("synthetic", "digits") for name in PAPER_HEADS}),
}
