"""Per-epoch costs that survive a shared machine.

Training is deterministic per seed, so the epochs each model needs to converge are fixed;
only the clocks move when other work shares the machine. The protocol therefore measures
each model's cost per epoch separately: short probes of every model (a block of training
steps, one validation pass, one conversion, one m_t observation), run round-robin
(interleaved, the order rotated each round) so that load hits every model alike, repeated,
summarised by the minimum (the least-disturbed repeat) with the median and max beside it.
Time to convergence is then

    T = epochs × (minimum cost per epoch) + (minimum conversion cost)

which is what the reports call the headline, beside the raw wall clock and CPU time.

A training probe runs k = min(steps, steps per epoch) optimizer steps (batches drawn as in
training) and scales them to a whole epoch (× steps per epoch / k); its validation is one
whole validation pass.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from glai_kernels.glai.graphed_step import graphed as graphed_step
from glai_kernels.glai.tasks import Task
from glai_kernels.glai.training import make_step, synchronize, training_step

# a probe does its work once and returns {part: (wall seconds, CPU seconds)}
Probe = Callable[[], dict[str, tuple[float, float]]]


@dataclass(frozen=True)
class Cost:
    """One part of one probe over the repeats. The robust value is the least-disturbed
    repeat: `seconds` = the minimum wall sample, `cpu_seconds` = the minimum CPU sample
    (other work only ever adds time to a probe, so the minimum is the closest to the work's
    own cost; two back-to-back runs at load 8 agreed within 9% on the minimum and 28% on
    the median). Also kept: the medians, the range of the wall samples (`low`, `high`) and
    every wall and CPU sample in run order."""

    seconds: float
    cpu_seconds: float
    median: float
    cpu_median: float
    high: float
    samples: tuple[float, ...]
    cpu_samples: tuple[float, ...] = ()

    @property
    def low(self) -> float:
        return self.seconds

    def on(self, clock_name: str) -> Cost:
        """This cost on one clock: "wall" (itself) or "cpu" (the CPU samples as its wall)."""
        if clock_name == "wall":
            return self
        if clock_name != "cpu":
            raise ValueError(f"clock must be 'wall' or 'cpu', got {clock_name!r}")
        return Cost.of([(c, c) for c in self.cpu_samples])

    @property
    def spread(self) -> float:
        """(max − min) / min of the wall samples: 0 on a quiet machine."""
        return (self.high - self.low) / self.low if self.low > 0 else 0.0

    @classmethod
    def of(cls, samples: list[tuple[float, float]]) -> Cost:
        walls, cpus = [w for w, _ in samples], [c for _, c in samples]
        return cls(min(walls), min(cpus), statistics.median(walls), statistics.median(cpus),
                   max(walls), tuple(walls), tuple(cpus))


def clock(device: torch.device, fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds of fn(), device-synchronised."""
    synchronize(device)
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    synchronize(device)
    return time.perf_counter() - start, time.process_time() - cpu


def interleaved(probes: dict[str, Probe], repeats: int) -> dict[str, dict[str, Cost]]:
    """Run every probe once per round, `repeats` rounds, the order rotated by one each round
    (so no probe always follows the same neighbour); {probe: {part: Cost}}."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(probes)
    samples: dict[str, dict[str, list]] = {name: {} for name in names}
    for round_ in range(repeats):
        shift = round_ % max(len(names), 1)
        for name in names[shift:] + names[:shift]:
            for part, value in probes[name]().items():
                samples[name].setdefault(part, []).append(value)
    return {name: {part: Cost.of(values) for part, values in parts.items()}
            for name, parts in samples.items()}


def training_probe(model: nn.Module, task: Task, optimizer: torch.optim.Optimizer, *,
                   steps: int, seed: int, validate: bool = True,
                   fused_step: bool = True, kind: str | None = None,
                   graphs: bool = False) -> Probe:
    """A probe of `model`'s epoch: parts "train" (k steps scaled to a whole epoch) and,
    with `validate`, "validate" (one validation pass) and "epoch" (their sum). One untimed
    step first, so the optimizer's state exists before any timed step. Trains `model`
    further: call it after the model's results are recorded. Its steps are `fit`'s
    (`training_step`, fused for a sparse head with Adam unless `fused_step` is False), so
    the cost describes what was trained; or, with `kind`, the steps of that kind
    (`training.make_step`: "ordinary", "fused", "hand-fused", "compiled"). A compiled step
    first takes a whole untimed epoch, so every batch shape is compiled before the clock
    runs. With `graphs`, the step is replayed from CUDA graphs (glai/graphed_step.py; the
    eager stand-in off CUDA), warmed and captured, for every batch shape the timed steps
    meet, before the clock runs; the probe's `graphed` attribute is the GraphedStep (how its
    captures went). The optimizer must be ready for a capture (`prepare_optimizer`)."""
    device = next(model.parameters()).device
    per_epoch = task.steps_per_epoch()
    count = max(1, min(steps, per_epoch))
    gen = torch.Generator().manual_seed(seed)
    step = (training_step(model, task, optimizer, fused_step) if kind is None
            else make_step(kind, model, task, optimizer))

    model.train()
    warm = task.batches(gen) if kind == "compiled" else itertools.islice(task.batches(gen), 1)
    for batch in warm:
        step(batch)
    graphed = None
    if graphs:
        graphed = step = graphed_step(step, device)
        # each shape of the timed steps' batches is warmed, then captured, off the clock
        for _ in range(graphed.warmup + 1):
            for batch in itertools.islice(task.batches(gen), count):
                step(batch)

    def train() -> None:
        for batch in itertools.islice(task.batches(gen), count):
            step(batch)

    def probe() -> dict[str, tuple[float, float]]:
        model.train()
        wall, cpu = clock(device, train)
        parts = {"train": (wall * per_epoch / count, cpu * per_epoch / count)}
        if validate:
            val_wall, val_cpu = clock(device, lambda: task.validate(model))
            parts["validate"] = (val_wall, val_cpu)
            parts["epoch"] = (parts["train"][0] + val_wall, parts["train"][1] + val_cpu)
        return parts

    probe.graphed = graphed  # type: ignore[attr-defined]
    return probe


def once_probe(device: torch.device, fn: Callable[[], object], part: str) -> Probe:
    """A probe timing fn() as one part (a conversion, an m_t observation)."""
    return lambda: {part: clock(device, fn)}
