"""The paper's protocol (Section 4.1, Tables 2-3) for one head, one data set and one seed.

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
linear baseline) and trains with InfoNCE; family C trains on episodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from bench.pipeline.data import EmbeddingSplits
from bench.pipeline.train import (
    Classification,
    Contrastive,
    EarlyStopping,
    FewShot,
    Task,
    fit,
    make_optimizer,
    synchronize,
)
from glai_kernels.glai import (
    StructureMonitor,
    count_parameters,
    fixed_reduced_epochs,
    from_mlp,
    make_mlp,
    path_budget,
    prune,
    reduce_mlp,
)
from glai_kernels.heads import PaperHead

# Section 4.1 (SPEC §3): (patience, min delta); accuracy in % for A and C, loss for B
EARLY_STOPPING = {"A1": (5, 0.1), "A2": (5, 0.1), "B1": (5, 1e-5), "B2": (5, 0.01),
                  "C1": (30, 1.0), "C2": (30, 1.0)}
DROPOUT = {"B1": 0.2, "B2": 0.4}
EPISODES = {"C1": (5, 4, 6), "C2": (5, 5, 10)}  # way, shot, query
MODELS = ("MLP", "MLP reduced", "GLAI", "GLAI structured", "Linear")


def _key(head: PaperHead) -> str:
    return head.name.split("-")[0]  # scaled test heads are named e.g. "A1-tiny"


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
        patience, delta = EARLY_STOPPING[_key(head)]
        if self.patience_cap is not None:
            patience = min(patience, self.patience_cap)
        return EarlyStopping(patience, delta, higher_is_better=head.family != "B")

    def epoch_cap(self, head: PaperHead) -> int:
        return {"B": self.max_epochs_b, "C": self.max_epochs_c}.get(head.family,
                                                                   self.max_epochs)


def make_task(head: PaperHead, data: EmbeddingSplits, protocol: Protocol, seed: int,
              device: torch.device) -> Task:
    x = {s: t.to(device) for s, t in data.x.items()}
    y = {s: (t.to(device) if t is not None else None) for s, t in data.y.items()}
    if head.family == "A":
        return Classification(x["train"], y["train"], x["val"], y["val"], head.batch_size)
    if head.family == "B":
        return Contrastive(x["train"], x["val"], head.batch_size)
    way, shot, query = EPISODES[_key(head)]
    return FewShot(x["train"], y["train"], x["val"], y["val"], way=way, shot=shot, query=query,
                   episodes=protocol.episodes_per_epoch, val_episodes=protocol.val_episodes,
                   seed=seed)


def original_mlp(head: PaperHead) -> nn.Sequential:
    return make_mlp((head.n0, head.n1, head.n2), dropout=DROPOUT.get(_key(head), 0.0))


def linear_head(head: PaperHead) -> nn.Sequential:
    rate = DROPOUT.get(_key(head), 0.0)
    return nn.Sequential(*([nn.Dropout(rate)] if rate else []), nn.Linear(head.n0, head.n2))


def _record(head, data, seed, model, result, **extra) -> dict:
    return {"data": data.name, "head": head.name, "family": head.family, "seed": seed,
            "model": model, "epochs": result.epochs, "bvs": result.best_score,
            "seconds": result.seconds, "cpu_seconds": result.cpu_seconds, **extra}


def run_baseline(name: str, model: nn.Module, head: PaperHead, data: EmbeddingSplits,
                 task: Task, protocol: Protocol, seed: int, *,
                 monitor: StructureMonitor | None = None) -> dict:
    """Train an MLP or linear head with SGD; `monitor` logs its m_t per epoch (untimed)."""
    optimizer = make_optimizer("sgd", model.parameters(), lr=head.lr,
                               weight_decay=head.mlp_weight_decay)
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

    optimizer = make_optimizer("sgd", reduced.parameters(), lr=head.lr,
                               weight_decay=head.mlp_weight_decay)
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
        optimizer = make_optimizer("adam", model.parameters(), lr=head.lr,
                                   weight_decay=head.glai_weight_decay)
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
