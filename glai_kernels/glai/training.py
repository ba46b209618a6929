"""Training a model on a task: the loop, early stopping, optimizers, per-phase wall-clock.

`fit` trains until early stopping (or an epoch cap); wall-clock and CPU time are
device-synchronised (CUDA runs asynchronously) and exclude per-epoch monitoring.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from glai_kernels.glai.fused_step import fused_step_for
from glai_kernels.glai.mlp_step import HandFusedMLPStep, compiled_mlp_step
from glai_kernels.glai.tasks import Task

# the steps a model can train by: the ordinary loop (the paper protocol's, every model) and
# the engineered ones (GLAI's fused sparse step; the MLPs' hand-fused and compiled steps)
STEP_KINDS = ("ordinary", "fused", "hand-fused", "compiled")


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
    fused_step: bool = False  # trained by glai_kernels.glai.fused_step (a sparse head + Adam)


def make_optimizer(kind: str, params, *, lr: float, weight_decay: float):
    """SGD (the MLPs) or Adam (the estimator), fused kernels where this torch has them (torch
    2.13 on CPU: SGD, Adam, AdamW and Adagrad take fused=True). Fused is also the fastest
    ordinary GLAI step measured (issue 41, A1 at B = 16: foreach Adam 1.41x the step with
    fused Adam, single-tensor 1.24x; zero_grad(set_to_none=False) 1.09x)."""
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[kind]
    params = list(params)
    try:
        return cls(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return cls(params, lr=lr, weight_decay=weight_decay)


class _Fused:
    def __init__(self, stepper, task: Task) -> None:
        self.stepper, self.task = stepper, task

    def __call__(self, batch) -> None:
        self.stepper.step(lambda model: self.task.loss(model, batch))


def _ordinary(model: nn.Module, task: Task, optimizer: torch.optim.Optimizer
              ) -> Callable[[object], None]:
    def ordinary(batch) -> None:
        optimizer.zero_grad(set_to_none=True)
        task.loss(model, batch).backward()
        optimizer.step()
    return ordinary


def on_torch_gemm(model: nn.Module) -> nn.Module:
    """`model` as the paper's ordinary loop runs it. For a model holding a GLAI selector
    (PathSelector), a deep copy whose selectors run their frozen layers on torch's GEMM
    (`PathSelector.gemm = "torch"`, F.linear), as the paper's reduced MLP layer ran and as
    the MLPs' own nn.Linear layers run in the same protocol; the extension's GEMM (about 2x
    torch's at the paper's batch on CPU, docs/notes/sparse.md, "The selector's GEMM (stop
    21)") is engineering the MLP's ordinary loop does not get (docs/ARCHITECTURE.md §4, the
    fair comparison). Any other model is returned itself. The copy's parameters are its own."""
    from glai_kernels.glai.selector import PathSelector

    if not any(isinstance(m, PathSelector) for m in model.modules()):
        return model
    twin = copy.deepcopy(model)
    for m in twin.modules():
        if isinstance(m, PathSelector):
            m.gemm = "torch"
    return twin


def training_step(model: nn.Module, task: Task, optimizer: torch.optim.Optimizer,
                  fused: bool = True) -> Callable[[object], None]:
    """step(batch): one optimizer step of `model` on `task`'s loss for a batch; the fused
    sparse step where `fused` and the model and optimizer support it (see `fit`)."""
    stepper = fused_step_for(model, optimizer) if fused else None
    if stepper is not None:
        return _Fused(stepper, task)
    return _ordinary(model, task, optimizer)


def make_step(kind: str, model: nn.Module, task: Task, optimizer: torch.optim.Optimizer
              ) -> Callable[[object], None]:
    """step(batch) of one kind (`STEP_KINDS`), each the ordinary step's updates (to
    rounding): "ordinary" (zero_grad, backward, optimizer.step), "fused" (FusedSparseStep:
    a sparse GLAIHead with Adam/AdamW), "hand-fused" (HandFusedMLPStep: a Linear/ReLU/Dropout
    chain), "compiled" (compiled_mlp_step: its first calls compile). ValueError, naming the
    argument, for an unknown kind or a model the kind cannot step."""
    if kind == "ordinary":
        return _ordinary(model, task, optimizer)
    if kind == "fused":
        stepper = fused_step_for(model, optimizer)
        if stepper is None:
            raise ValueError("kind 'fused' needs a sparse GLAIHead and an Adam/AdamW optimizer "
                             f"over its parameters, got {type(model).__name__} and "
                             f"{type(optimizer).__name__}")
        return _Fused(stepper, task)
    if kind == "hand-fused":
        stepper = HandFusedMLPStep(model, optimizer)
        return lambda batch: stepper.step(lambda stand_in: task.loss(stand_in, batch))
    if kind == "compiled":
        return compiled_mlp_step(model, task.loss, optimizer)
    raise ValueError(f"kind must be one of {STEP_KINDS}, got {kind!r}")


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
    fused_step: bool = True,
) -> FitResult:
    """Train until early stopping (or `max_epochs`); `after_epoch(epoch)` may return True to
    stop (the automatic structural switch). Wall-clock excludes `after_epoch`.

    With `fused_step` (the default), a sparse-layout GLAIHead trained by Adam/AdamW takes
    `FusedSparseStep`'s steps (the ordinary step without autograd over the estimator or
    torch.optim's wrapper, the kept values' Adam update inside the `cpp` dvalues kernel: the
    same arithmetic to rounding); anything else, or `fused_step=False`, takes the ordinary
    zero_grad / backward / step."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    step = training_step(model, task, optimizer, fused_step)
    result = FitResult(0, None, fused_step=isinstance(step, _Fused))
    model.train()
    synchronize(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    for epoch in range(1, max_epochs + 1):
        for batch in task.batches(gen):
            step(batch)
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
