"""The paper's protocol (Section 4.1, Tables 2-3) for one head, one data set and one seed.

`run_head(head, data, seed, protocol)` trains every model of Table 3 and returns one record
(a dict: epochs, best validation score, wall-clock per phase, parameters, ...) per model.

Models, each trained until early stopping (or the preset's epoch cap):
  MLP            the original head (n0, n1, n2), SGD, Table 2's LR / batch / MLP weight decay
  MLP reduced    (n0, rho*n1, n2) trained the same way (Table 3's baseline)
  Linear         one nn.Linear(n0, n2), SGD (Table 3's baseline)
  GLAI           phase 1: a fresh reduced MLP, SGD, for the paper's fixed fraction of the
                 original's epochs (20% A, 15% B, 10% C) or until m_t settles (`switch="auto"`);
                 phase 2: conversion (from_mlp, parameter matching, path-norm pruning over Ω);
                 phase 3: the estimator, Adam with GLAI weight decay, early stopping
  GLAI structured  the same phase-1 MLP, pruned by whole path columns (a smaller dense P)
Family B adds dropout (B1 0.2, B2 0.4) after the hidden layer (before the Linear head for the
linear baseline) and trains with InfoNCE; family C trains on episodes. The per-head settings
(LR, batch, weight decays, patience, dropout, episode shapes, InfoNCE temperature) are
glai_kernels/glai/paper_training.py's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from glai_kernels.glai.convergence import StructureMonitor, fixed_reduced_epochs
from glai_kernels.glai.convert import from_mlp
from glai_kernels.glai.embeddings import EmbeddingSplits
from glai_kernels.glai.episodes import FewShot
from glai_kernels.glai.matching import count_parameters, path_budget
from glai_kernels.glai.mlp import make_mlp, reduce_mlp
from glai_kernels.glai.paper_training import paper_training
from glai_kernels.glai.prune import prune
from glai_kernels.glai.tasks import Classification, Contrastive, Task
from glai_kernels.glai.training import EarlyStopping, fit, make_optimizer, synchronize
from glai_kernels.paper_heads import PaperHead

MODELS = ("MLP", "MLP reduced", "GLAI", "GLAI structured", "Linear")


@dataclass(frozen=True)
class Protocol:
    """The knobs a preset sets (the rest is the paper's)."""

    max_epochs: int = 60  # cap for early-stopped training, family A
    max_epochs_b: int = 60  # family B (its GLAI estimators are the big ones)
    max_epochs_c: int = 300  # family C (patience 30)
    patience_cap: int | None = None  # quick runs only: shorter patience than the paper's
    reference_size: int = 2048  # Ω for path norms and m_t: the first rows of the train split
    switch: str = "fixed"  # "fixed" (paper's fractions) or "auto" (m_t settled)
    episodes_per_epoch: int = 50
    val_episodes: int = 50
    structured: bool = True
    monitor: bool = True  # log m_t per epoch of GLAI's reduced MLP (not timed in "fixed")
    device: str = "cpu"

    def early_stopping(self, head: PaperHead) -> EarlyStopping:
        settings = paper_training(head)
        patience, delta = settings.patience, settings.min_delta
        if self.patience_cap is not None:
            patience = min(patience, self.patience_cap)
        return EarlyStopping(patience, delta, higher_is_better=head.family != "B")

    def epoch_cap(self, head: PaperHead) -> int:
        return {"B": self.max_epochs_b, "C": self.max_epochs_c}.get(head.family,
                                                                   self.max_epochs)


def make_task(head: PaperHead, data: EmbeddingSplits, protocol: Protocol, seed: int,
              device: torch.device) -> Task:
    """The family's task on `data`, moved to `device`."""
    settings = paper_training(head)
    x = {s: t.to(device) for s, t in data.x.items()}
    y = {s: (t.to(device) if t is not None else None) for s, t in data.y.items()}
    if head.family == "A":
        return Classification(x["train"], y["train"], x["val"], y["val"], settings.batch_size)
    if head.family == "B":
        return Contrastive(x["train"], x["val"], settings.batch_size,
                           temperature=settings.temperature)
    way, shot, query = settings.episode
    return FewShot(x["train"], y["train"], x["val"], y["val"], way=way, shot=shot, query=query,
                   episodes=protocol.episodes_per_epoch, val_episodes=protocol.val_episodes,
                   seed=seed)


def original_mlp(head: PaperHead) -> nn.Sequential:
    """The head as the paper trains it: (n0, n1, n2), with its dropout (family B)."""
    return make_mlp((head.n0, head.n1, head.n2), dropout=paper_training(head).dropout)


def linear_head(head: PaperHead) -> nn.Sequential:
    """Table 3's linear baseline: nn.Linear(n0, n2), after the head's dropout (family B)."""
    rate = paper_training(head).dropout
    return nn.Sequential(*([nn.Dropout(rate)] if rate else []), nn.Linear(head.n0, head.n2))


def _record(head, data, seed, model, result, **extra) -> dict:
    return {"data": data.name, "head": head.name, "family": head.family, "seed": seed,
            "model": model, "epochs": result.epochs, "bvs": result.best_score,
            "seconds": result.seconds, "cpu_seconds": result.cpu_seconds, **extra}


def run_baseline(name: str, model: nn.Module, head: PaperHead, data: EmbeddingSplits,
                 task: Task, protocol: Protocol, seed: int, *,
                 monitor: StructureMonitor | None = None) -> dict:
    """Train an MLP or linear head with SGD; `monitor` logs its m_t per epoch (untimed)."""
    settings = paper_training(head)
    optimizer = make_optimizer("sgd", model.parameters(), lr=settings.lr,
                               weight_decay=settings.mlp_weight_decay)
    after_epoch = None
    if monitor is not None:
        monitor.observe(model)

        def after_epoch(_epoch: int) -> bool:
            monitor.observe(model)
            return False  # logging only: never stops training
    result = fit(model, task, optimizer, max_epochs=protocol.epoch_cap(head),
                 early=protocol.early_stopping(head), seed=seed, after_epoch=after_epoch)
    extra = {"m_history": list(monitor.history)} if monitor is not None else {}
    return _record(head, data, seed, name, result, params=count_parameters(model), **extra)


def _timed(device: torch.device, fn):
    """(fn(), wall seconds, CPU seconds), device-synchronised."""
    synchronize(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    value = fn()
    synchronize(device)
    return value, time.perf_counter() - start, time.process_time() - cpu_start


def run_glai(head: PaperHead, data: EmbeddingSplits, task: Task, protocol: Protocol, seed: int,
             mlp_epochs: int, device: torch.device) -> list[dict]:
    """GLAI (and its structured variant) after the paper's pipeline; one record each."""
    settings = paper_training(head)
    template = original_mlp(head)
    torch.manual_seed(1000 * seed + 2)
    reduced = reduce_mlp(template, head.rho).to(device)
    reference = data.x["train"][:protocol.reference_size].to(device)
    monitor = StructureMonitor(reference)
    fixed = fixed_reduced_epochs(head.family, mlp_epochs)
    auto = protocol.switch == "auto"
    if protocol.monitor or auto:
        monitor.observe(reduced)

    def after_epoch(_epoch: int) -> bool:
        if protocol.monitor or auto:
            monitor.observe(reduced)
        return auto and monitor.settled()

    optimizer = make_optimizer("sgd", reduced.parameters(), lr=settings.lr,
                               weight_decay=settings.mlp_weight_decay)
    phase1 = fit(reduced, task, optimizer, max_epochs=protocol.epoch_cap(head) if auto else fixed,
                 early=None, seed=seed, validate=False, after_epoch=after_epoch)
    t_reduced = phase1.seconds + (phase1.monitor_seconds if auto else 0.0)

    full, t_convert, cpu_convert = _timed(device, lambda: from_mlp(reduced.eval()))
    budget = path_budget(template, reduced, full)
    records = []
    for variant, structured in (("GLAI", False), ("GLAI structured", True)):
        if structured and not protocol.structured:
            continue
        pruned, t_prune, cpu_prune = _timed(device, lambda s=structured: prune(
            full, reference, keep=budget.keep, structured=s))
        model = pruned.head.train()
        initial = task.validate(model)
        optimizer = make_optimizer("adam", model.parameters(), lr=settings.lr,
                                   weight_decay=settings.glai_weight_decay)
        result = fit(model, task, optimizer, max_epochs=protocol.epoch_cap(head),
                     early=protocol.early_stopping(head), seed=seed)
        total = count_parameters(reduced) + count_parameters(model)
        records.append(_record(
            head, data, seed, variant, result,
            seconds=t_reduced + t_convert + t_prune + result.seconds,
            cpu_seconds=phase1.cpu_seconds + cpu_convert + cpu_prune + result.cpu_seconds,
            t_reduced=t_reduced, t_convert=t_convert + t_prune, t_estimator=result.seconds,
            t_monitor=phase1.monitor_seconds, reduced_epochs=phase1.epochs,
            estimator_epochs=result.epochs, epochs_total=phase1.epochs + result.epochs,
            params=total, params_original=budget.original, params_budget_capped=budget.capped,
            kept=pruned.kept, candidates=pruned.candidates, mu=pruned.mu, paths=model.paths,
            initial_score=initial, backend=model.backend_used, switch=protocol.switch,
            m_history=list(monitor.history)))
    return records


def run_head(head: PaperHead, data: EmbeddingSplits, seed: int, protocol: Protocol) -> list[dict]:
    """Every model of Table 3 for one (head, data, seed)."""
    device = torch.device(protocol.device)
    task = make_task(head, data, protocol, seed, device)
    records = []
    torch.manual_seed(1000 * seed)
    original = original_mlp(head).to(device)
    monitor = None
    if protocol.monitor:  # the original MLP's m_t, as in the paper's Figure 3
        monitor = StructureMonitor(data.x["train"][:protocol.reference_size].to(device))
    records.append(run_baseline("MLP", original, head, data, task, protocol, seed,
                                monitor=monitor))
    torch.manual_seed(1000 * seed + 1)
    reduced = reduce_mlp(original_mlp(head), head.rho).to(device)
    records.append(run_baseline("MLP reduced", reduced, head, data, task, protocol, seed))
    records.extend(run_glai(head, data, task, protocol, seed, records[0]["epochs"], device))
    torch.manual_seed(1000 * seed + 3)
    records.append(run_baseline("Linear", linear_head(head).to(device), head, data, task,
                                protocol, seed))
    return records
