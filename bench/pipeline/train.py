"""Training loops for the three task families, early stopping and per-phase wall-clock.

A: cross-entropy classification, validation accuracy (%).
B: two dropout views of the same batch through the head, symmetric InfoNCE (temperature 0.07);
   validation InfoNCE loss on fixed dropout masks (the same seed every epoch, so epochs are
   comparable).
C: episodic N-way K-shot Q-query: a prototypical-network loss on the head's outputs
   (prototype = mean support output; logits = −squared distance); validation accuracy (%) on
   a fixed set of episodes from the validation classes. One episode is one optimizer step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

TEMPERATURE = 0.07


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock covers it (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Task:
    """What a family trains on: batches, a loss and a validation score."""

    higher_is_better: bool = True

    def batches(self, gen: torch.Generator) -> Iterator:
        raise NotImplementedError

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        raise NotImplementedError

    def validate(self, model: nn.Module) -> float:
        raise NotImplementedError


class Classification(Task):
    """Family A."""

    def __init__(self, x, y, x_val, y_val, batch_size: int) -> None:
        self.x, self.y, self.x_val, self.y_val = x, y, x_val, y_val
        self.batch_size = batch_size

    def batches(self, gen):
        order = torch.randperm(len(self.x), generator=gen).to(self.x.device)
        for rows in order.split(self.batch_size):
            yield self.x[rows], self.y[rows]

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    @torch.no_grad()
    def validate(self, model):
        model.eval()
        correct = sum(int((model(x).argmax(1) == y).sum())
                      for x, y in zip(self.x_val.split(4096), self.y_val.split(4096),
                                      strict=True))
        model.train()
        return 100.0 * correct / len(self.x_val)


def info_nce(z1: torch.Tensor, z2: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """Symmetric InfoNCE between two views [B, D]: positives on the diagonal."""
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    logits = z1 @ z2.t() / temperature
    target = torch.arange(len(z1), device=z1.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


def two_views(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two dropout views of the same batch in one forward of [x; x] (dropout masks are drawn
    per row, so this is two independent views; one pass reads the weights once)."""
    z = model(torch.cat([x, x]))
    return z[:len(x)], z[len(x):]


class Contrastive(Task):
    """Family B: the model's own dropout makes the two views."""

    higher_is_better = False

    def __init__(self, x, x_val, batch_size: int, *, val_seed: int = 12345) -> None:
        self.x, self.x_val, self.batch_size, self.val_seed = x, x_val, batch_size, val_seed

    def batches(self, gen):
        order = torch.randperm(len(self.x), generator=gen).to(self.x.device)
        for rows in order.split(self.batch_size):
            if len(rows) > 1:  # one sample has no negatives
                yield self.x[rows]

    def loss(self, model, batch):
        return info_nce(*two_views(model, batch))

    @torch.no_grad()
    def validate(self, model):
        model.train()  # dropout on: the views are the point
        devices = [self.x_val.device] if self.x_val.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.val_seed)
            losses = [float(info_nce(*two_views(model, x))) * len(x)
                      for x in self.x_val.split(self.batch_size) if len(x) > 1]
        return sum(losses) / len(self.x_val)


class FewShot(Task):
    """Family C: `way`-way `shot`-shot `query`-query episodes."""

    def __init__(self, x, y, x_val, y_val, *, way: int, shot: int, query: int,
                 episodes: int, val_episodes: int, seed: int = 0) -> None:
        self.x, self.y, self.way, self.shot, self.query = x, y, way, shot, query
        self.episodes = episodes
        self.x_val = x_val
        self._by_class = self._index(y)
        by_class_val = self._index(y_val)
        for name, groups in (("training", self._by_class), ("validation", by_class_val)):
            usable = [c for c, rows in groups.items() if len(rows) >= shot + query]
            if len(usable) < way:
                raise ValueError(f"{name} split has {len(usable)} classes with >= {shot + query} "
                                 f"samples; {way}-way episodes need {way}")
        gen = torch.Generator().manual_seed(54321 + seed)
        self.val = [self._episode(by_class_val, gen) for _ in range(val_episodes)]

    def _index(self, y):
        return {c: (y == c).nonzero().flatten() for c in y.unique().tolist()}

    def _episode(self, groups, gen):
        usable = [c for c, rows in groups.items() if len(rows) >= self.shot + self.query]
        chosen = torch.randperm(len(usable), generator=gen)[:self.way].tolist()
        support, query = [], []
        for c in chosen:
            rows = groups[usable[c]]
            rows = rows[torch.randperm(len(rows), generator=gen)[:self.shot + self.query]]
            support.append(rows[:self.shot])
            query.append(rows[self.shot:])
        return torch.stack(support), torch.stack(query)  # [way, shot], [way, query]

    def batches(self, gen):
        for _ in range(self.episodes):
            yield self._episode(self._by_class, gen)

    def _logits(self, model, x, episode):
        support, query = episode
        way = support.shape[0]
        rows = torch.cat([support.flatten(), query.flatten()]).to(x.device)
        z = model(x[rows])
        prototypes = z[:support.numel()].view(way, self.shot, -1).mean(1)
        return -torch.cdist(z[support.numel():], prototypes).square()

    def loss(self, model, episode):
        target = torch.arange(self.way, device=self.x.device).repeat_interleave(self.query)
        return F.cross_entropy(self._logits(model, self.x, episode), target)

    @torch.no_grad()
    def validate(self, model):
        model.eval()
        target = torch.arange(self.way, device=self.x_val.device).repeat_interleave(self.query)
        correct = sum(int((self._logits(model, self.x_val, ep).argmax(1) == target).sum())
                      for ep in self.val)
        model.train()
        return 100.0 * correct / (len(self.val) * self.way * self.query)


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
    synchronize(device)
    result.seconds = time.perf_counter() - start
    result.cpu_seconds = time.process_time() - cpu_start
    if result.scores:
        result.best_score = (max if task.higher_is_better else min)(result.scores)
    return result
