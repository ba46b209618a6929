"""What a family of heads trains on: batches, a loss and a validation score.

A (`Classification`): cross-entropy, validation accuracy (%).
B (`Contrastive`): two dropout views of the same batch through the head, symmetric InfoNCE;
   validation InfoNCE loss on fixed dropout masks (the same seed every epoch, so epochs are
   comparable).
C: few-shot episodes, glai_kernels/glai/episodes.py.
x [N, n0] float, y [N] int64 class ids; a model maps [B, n0] -> [B, n2].
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn


class Task:
    """What a family trains on: batches, a loss and a validation score."""

    higher_is_better: bool = True

    def batches(self, gen: torch.Generator) -> Iterator:
        raise NotImplementedError

    def steps_per_epoch(self) -> int:
        """Optimizer steps (batches) in one epoch of `batches`."""
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

    def steps_per_epoch(self):
        return -(-len(self.x) // self.batch_size)

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


def info_nce(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
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

    def __init__(self, x, x_val, batch_size: int, *, temperature: float,
                 val_seed: int = 12345) -> None:
        self.x, self.x_val, self.batch_size, self.val_seed = x, x_val, batch_size, val_seed
        self.temperature = temperature

    def batches(self, gen):
        order = torch.randperm(len(self.x), generator=gen).to(self.x.device)
        for rows in order.split(self.batch_size):
            if len(rows) > 1:  # one sample has no negatives
                yield self.x[rows]

    def steps_per_epoch(self):
        full, tail = divmod(len(self.x), self.batch_size)
        return full + (tail > 1)

    def loss(self, model, batch):
        return info_nce(*two_views(model, batch), self.temperature)

    @torch.no_grad()
    def validate(self, model):
        model.train()  # dropout on: the views are the point
        devices = [self.x_val.device] if self.x_val.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.val_seed)
            losses = [float(info_nce(*two_views(model, x), self.temperature)) * len(x)
                      for x in self.x_val.split(self.batch_size) if len(x) > 1]
        return sum(losses) / len(self.x_val)
