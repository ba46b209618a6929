"""Training a model on a task: the loop, early stopping, optimizers, per-phase wall-clock.

`fit` trains until early stopping (or an epoch cap); wall-clock and CPU time are
device-synchronised (CUDA runs asynchronously) and exclude per-epoch monitoring.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from glai_kernels.glai.tasks import Task


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock covers it (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class EarlyStopping:
    """Stop after `patience` epochs without an improvement larger than `min_delta`."""

    patience: int
    min_delta: float
    higher_is_better: bool = True
    best: float | None = None
    stale: int = 0

    def improved(self, score: float) -> bool:
        if self.best is None:
            return True
        gain = score - self.best if self.higher_is_better else self.best - score
        return gain > self.min_delta

    def step(self, score: float) -> bool:
        """Record an epoch's score; True when training should stop."""
        if self.improved(score):
            self.best, self.stale = score, 0
        else:
            self.stale += 1
        return self.stale >= self.patience


@dataclass
class FitResult:
    epochs: int
    best_score: float | None
    scores: list[float] = field(default_factory=list)
    seconds: float = 0.0  # wall-clock of training and validation, device-synchronised
    cpu_seconds: float = 0.0  # this process's CPU time over the same span (all threads)
    monitor_seconds: float = 0.0  # time spent in `after_epoch` (m_t logging), not in seconds
    capped: bool = False  # ran all max_epochs without early stopping (or after_epoch) stopping it


def make_optimizer(kind: str, params, *, lr: float, weight_decay: float):
    """SGD (the MLPs) or Adam (the estimator), fused kernels where this torch has them."""
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[kind]
    params = list(params)
    try:
        return cls(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return cls(params, lr=lr, weight_decay=weight_decay)


def fit(
    model: nn.Module,
    task: Task,
    optimizer: torch.optim.Optimizer,
    *,
    max_epochs: int,
    early: EarlyStopping | None,
    seed: int,
    validate: bool = True,
    after_epoch: Callable[[int], bool] | None = None,
) -> FitResult:
    """Train until early stopping (or `max_epochs`); `after_epoch(epoch)` may return True to
    stop (the automatic structural switch). Wall-clock excludes `after_epoch`."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    result = FitResult(0, None)
    model.train()
    synchronize(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    for epoch in range(1, max_epochs + 1):
        for batch in task.batches(gen):
            optimizer.zero_grad(set_to_none=True)
            task.loss(model, batch).backward()
            optimizer.step()
        result.epochs = epoch
        stop = False
        if validate:
            score = task.validate(model)
            result.scores.append(score)
            if early is not None:
                stop = early.step(score)
        if after_epoch is not None:
            synchronize(device)
            paused, cpu_paused = time.perf_counter(), time.process_time()
            stop = after_epoch(epoch) or stop
            result.monitor_seconds += time.perf_counter() - paused
            start += time.perf_counter() - paused
            cpu_start += time.process_time() - cpu_paused
        if stop:
            break
    else:
        result.capped = max_epochs > 0
    synchronize(device)
    result.seconds = time.perf_counter() - start
    result.cpu_seconds = time.process_time() - cpu_start
    if result.scores:
        result.best_score = (max if task.higher_is_better else min)(result.scores)
    return result
