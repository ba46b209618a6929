"""Family C's few-shot episodes: N-way K-shot Q-query, a prototypical-network loss.

prototype = mean support output per class; logits = −squared distance of each query output
to the prototypes; validation accuracy (%) on a fixed set of episodes from the validation
classes. One episode is one optimizer step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glai_kernels.glai.tasks import Task


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

    def steps_per_epoch(self):
        return self.episodes

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
