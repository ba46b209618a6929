"""The paper's protocol (Section 4.1, Tables 2-3) for one head, one data set and one seed.

`run_head(head, data, seed, protocol)` trains every model of Table 3 and returns one record
(a dict: epochs, best validation score, times per phase, parameters, ...) per model.

Models, each trained until early stopping (or the preset's epoch cap):
  MLP            the original head (n0, n1, n2), SGD, Table 2's LR / batch / MLP weight decay
  MLP reduced    (n0, rho*n1, n2) trained the same way (Table 3's baseline)
  Linear         one nn.Linear(n0, n2), SGD (Table 3's baseline)
  GLAI           phase 1: a fresh reduced MLP, SGD, for the paper's fixed fraction of the
                 original's epochs (20% A, 15% B, 10% C);
                 phase 2: conversion (from_mlp, parameter matching, path-norm pruning over Ω
                 to the kept paths, in the layout `Protocol.layout` asks prune for: "auto"
                 keeps only the K kept values when the sparse op is the faster);
                 phase 3: the estimator, Adam with GLAI weight decay, early stopping
  GLAI auto      the same, phase 1 until the path distance m_t settles (`switch="auto"`,
                 its m_t observations timed as part of phase 1)
  GLAI structured  the first switch's phase-1 MLP, pruned by whole path columns (a smaller
                 dense P; a comparison row)
Family B adds dropout (B1 0.2, B2 0.4) after the hidden layer (before the Linear head for the
linear baseline) and trains with InfoNCE; family C trains on episodes. The per-head settings
(LR, batch, weight decays, patience, dropout, episode shapes, InfoNCE temperature) are
glai_kernels/glai/paper_training.py's.

Times per record: `seconds` / `cpu_seconds` are the raw wall clock and process CPU time of
the training run; `time_wall` / `time_cpu` are the time to convergence from robust costs
(glai_kernels/glai/timing.py): epochs × the least-disturbed (minimum) cost per epoch of
that model on that clock, measured after training by probes of every model interleaved
`Protocol.timing_repeats` times, plus GLAI's conversion (minimum of the run's and the
repeats'); `time` is the one on the headline clock (`headline_clock`: process CPU time on
a CPU device, wall on an accelerator). For GLAI `time` = t_reduced + t_convert +
t_estimator and `seconds` = wall_reduced + wall_convert + wall_estimator. `capped` says the
run stopped on the epoch cap, not on early stopping.

Two protocols (docs/ARCHITECTURE.md §4, "Comparing like with like"), priced from the same
training runs: training is deterministic and each protocol's steps compute the same updates
(to rounding; correctness/test_protocols.py), so they share every model's epochs and differ
only in the cost per epoch, each measured by its own interleaved probes:
  paper       (the headline; the record's own `time`, `epoch_cost`, ...): every model in
              the ordinary loop, `loss.backward()` and a fused torch.optim optimizer, the
              op's kernels inside autograd, every Linear layer on torch's GEMM (a GLAI
              selector's too: `training.on_torch_gemm`, as in the paper);
  engineered  (`record["engineered"]`, the same fields): every model with the fastest step
              this project gives it: a sparse GLAI estimator by `FusedSparseStep`; the MLPs
              and the linear head by the faster of a hand-fused step and a `torch.compile`d
              one (`Protocol.compile_mlp`), both measured in the same probes (the loser's
              cost is kept in `step_costs`); a dense GLAI head has no engineered step and
              keeps the ordinary one.
Which step trained a model: `trained_by` ("fused" for a sparse estimator with
`Protocol.fused_step`, else "ordinary").

With `Protocol.graphs` (bench/pipeline's default on a CUDA device) every model's ordinary step
is priced a third way, replayed from CUDA graphs (glai/graphed_step.py; probes "<model>
graphed", Adam's param groups capturable): the same models, the same epochs, both sides alike,
in `record["graphed"]` (the same fields, and `graphs`: how each model's capture went).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from glai_kernels.glai.convergence import StructureMonitor, fixed_reduced_epochs
from glai_kernels.glai.convert import from_mlp
from glai_kernels.glai.embeddings import EmbeddingSplits
from glai_kernels.glai.episodes import FewShot
from glai_kernels.glai.fused_step import supported as fused_supported
from glai_kernels.glai.graphed_step import prepare_optimizer
from glai_kernels.glai.matching import count_parameters, path_budget
from glai_kernels.glai.mlp import make_mlp, reduce_mlp
from glai_kernels.glai.paper_training import paper_training
from glai_kernels.glai.prune import prune
from glai_kernels.glai.tasks import Classification, Contrastive, Task
from glai_kernels.glai.timing import Cost, clock, interleaved, once_probe, training_probe
from glai_kernels.glai.training import (
    EarlyStopping,
    FitResult,
    fit,
    make_optimizer,
    on_torch_gemm,
)
from glai_kernels.paper_heads import PaperHead

MODELS = ("MLP", "MLP reduced", "GLAI", "GLAI auto", "GLAI structured", "Linear")
SWITCHES = {"fixed": "GLAI", "auto": "GLAI auto"}  # switch -> its Table 3 row


@dataclass(frozen=True)
class Protocol:
    """The knobs a preset sets (the rest is the paper's)."""

    max_epochs: int = 60  # cap for early-stopped training, family A
    max_epochs_b: int = 60  # family B (its GLAI estimators are the big ones)
    max_epochs_c: int = 300  # family C (patience 30)
    patience_cap: int | None = None  # quick runs only: shorter patience than the paper's
    reference_size: int = 2048  # Ω for path norms and m_t: the first rows of the train split
    switches: tuple[str, ...] = ("fixed", "auto")  # paper's fractions; m_t settled
    layout: str = "auto"  # unstructured GLAI's weights: prune's layout ("auto"/"sparse"/"dense")
    episodes_per_epoch: int = 50
    val_episodes: int = 50
    structured: bool = True
    monitor: bool = True  # log m_t per epoch of GLAI's reduced MLP (not timed in "fixed")
    timing_repeats: int = 3  # interleaved rounds of the cost probes (glai/timing.py)
    probe_steps: int = 64  # optimizer steps per training probe (scaled to an epoch)
    clock: str = "auto"  # headline clock: "wall", "cpu", or "auto" (cpu on a CPU device)
    fused_step: bool = True  # sparse GLAI estimators train by glai/fused_step.py (to rounding)
    engineered: bool = True  # also price every model's epochs with its engineered step
    compile_mlp: bool = True  # engineered MLP candidates include a torch.compile'd step
    device: str = "cpu"
    graphs: bool = False  # also price every model's ordinary step replayed from CUDA graphs

    def __post_init__(self) -> None:
        unknown = sorted(set(self.switches) - set(SWITCHES))
        if unknown or not self.switches:
            raise ValueError(f"switches must be a non-empty subset of {sorted(SWITCHES)}, "
                             f"got {self.switches!r}")
        if self.clock not in ("auto", "wall", "cpu"):
            raise ValueError(f"clock must be 'auto', 'wall' or 'cpu', got {self.clock!r}")

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


def _record(head, data, seed, model, result: FitResult, **extra) -> dict:
    return {"data": data.name, "head": head.name, "family": head.family, "seed": seed,
            "model": model, "epochs": result.epochs, "bvs": result.best_score,
            "seconds": result.seconds, "cpu_seconds": result.cpu_seconds,
            "capped": result.capped, **extra}


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
    return _record(head, data, seed, name, result, params=count_parameters(model),
                   trained_by="ordinary", **extra)


def _conversion(model: str) -> str:
    return "structured" if model == "GLAI structured" else "unstructured"


def _prune(full, reference, keep: int, structured: bool, layout: str):
    if structured:  # whole columns: a smaller dense P, no sparse layout
        return prune(full, reference, keep=keep, structured=True)
    return prune(full, reference, keep=keep, layout=layout)


@dataclass
class GLAIRun:
    """What `run_glai` trained: the records, and the models and work the cost probes time
    (estimator heads by row, the first switch's reduced MLP, Ω, the conversion by kind:
    "unstructured" for every switch's GLAI row, "structured")."""

    records: list[dict]
    reference: torch.Tensor
    estimators: dict[str, nn.Module] = field(default_factory=dict)
    reduced: nn.Module | None = None
    conversions: dict[str, object] = field(default_factory=dict)


def _phase1(head, task, protocol, seed, switch, reference, mlp_epochs) -> tuple:
    """A fresh reduced MLP trained for the switch's epochs: (model, FitResult, monitor)."""
    settings = paper_training(head)
    torch.manual_seed(1000 * seed + 2)
    reduced = reduce_mlp(original_mlp(head), head.rho).to(reference.device)
    monitor = StructureMonitor(reference)
    auto = switch == "auto"
    if protocol.monitor or auto:
        monitor.observe(reduced)

    def after_epoch(_epoch: int) -> bool:
        if protocol.monitor or auto:
            monitor.observe(reduced)
        return auto and monitor.settled()

    optimizer = make_optimizer("sgd", reduced.parameters(), lr=settings.lr,
                               weight_decay=settings.mlp_weight_decay)
    max_epochs = protocol.epoch_cap(head) if auto else fixed_reduced_epochs(
        head.family, mlp_epochs)
    result = fit(reduced, task, optimizer, max_epochs=max_epochs, early=None, seed=seed,
                 validate=False, after_epoch=after_epoch)
    return reduced, result, monitor


def run_glai(head: PaperHead, data: EmbeddingSplits, task: Task, protocol: Protocol, seed: int,
             mlp_epochs: int, device: torch.device) -> GLAIRun:
    """GLAI for each switch (and the structured variant) after the paper's pipeline."""
    settings = paper_training(head)
    template = original_mlp(head)
    reference = data.x["train"][:protocol.reference_size].to(device)
    run = GLAIRun([], reference=reference)
    for number, switch in enumerate(protocol.switches):
        reduced, phase1, monitor = _phase1(head, task, protocol, seed, switch, reference,
                                           mlp_epochs)
        auto = switch == "auto"
        wall_reduced = phase1.seconds + (phase1.monitor_seconds if auto else 0.0)
        full, t_convert, cpu_convert = _timed(device, lambda r=reduced: from_mlp(r.eval()))
        budget = path_budget(template, reduced, full)
        variants = [(SWITCHES[switch], False)]
        if number == 0:
            run.reduced = reduced
            if protocol.structured:
                variants.append(("GLAI structured", True))
        for variant, structured in variants:
            pruned, t_prune, cpu_prune = _timed(device, lambda s=structured, f=full, k=(
                budget.keep): _prune(f, reference, k, s, protocol.layout))
            if number == 0:  # the conversion as the probes repeat it, from the same MLP
                run.conversions[_conversion(variant)] = (
                    lambda r=reduced, k=budget.keep, s=structured: _prune(
                        from_mlp(r.eval()), reference, k, s, protocol.layout))
            model = pruned.head.train()
            initial = task.validate(model)
            optimizer = make_optimizer("adam", model.parameters(), lr=settings.lr,
                                       weight_decay=settings.glai_weight_decay)
            result = fit(model, task, optimizer, max_epochs=protocol.epoch_cap(head),
                         early=protocol.early_stopping(head), seed=seed,
                         fused_step=protocol.fused_step)
            run.estimators[variant] = model
            total = count_parameters(reduced) + count_parameters(model)
            wall_convert = t_convert + t_prune
            record = _record(
                head, data, seed, variant, result,
                seconds=wall_reduced + wall_convert + result.seconds,
                cpu_seconds=phase1.cpu_seconds + cpu_convert + cpu_prune + result.cpu_seconds,
                wall_reduced=wall_reduced, wall_convert=wall_convert,
                wall_estimator=result.seconds, t_monitor=phase1.monitor_seconds,
                cpu_convert=cpu_convert + cpu_prune,
                reduced_epochs=phase1.epochs, estimator_epochs=result.epochs,
                epochs_total=phase1.epochs + result.epochs,
                reduced_capped=auto and phase1.capped, params=total,
                params_original=budget.original, params_budget_capped=budget.capped,
                kept=pruned.kept, candidates=pruned.candidates, mu=pruned.mu,
                paths=model.paths, layout=model.layout,
                initial_score=initial, backend=model.backend_used, switch=switch,
                fused_step=result.fused_step,
                trained_by="fused" if result.fused_step else "ordinary",
                m_history=list(monitor.history))
            record["capped"] = result.capped or record["reduced_capped"]
            run.records.append(record)
    return run


def _timed(device: torch.device, fn):
    """(fn(), wall seconds, CPU seconds), device-synchronised."""
    box = []
    wall, cpu = clock(device, lambda: box.append(fn()))
    return box[0], wall, cpu


ENGINEERED = " engineered: "  # a probe "<model> engineered: <step kind>"
GRAPHED = " graphed"  # a probe "<model> graphed": the ordinary step replayed from CUDA graphs


def _engineered_kinds(name: str, model: nn.Module, optimizer, protocol: Protocol
                      ) -> tuple[str, ...]:
    """The engineered step kinds to try for one model (module docstring)."""
    if name.startswith("GLAI"):
        return ("fused",) if fused_supported(model, optimizer) else ("ordinary",)
    return ("hand-fused", "compiled") if protocol.compile_mlp else ("hand-fused",)


def measure_costs(head: PaperHead, task: Task, protocol: Protocol, seed: int,
                  models: dict[str, nn.Module], glai: GLAIRun,
                  device: torch.device, graph_notes: dict[str, str] | None = None
                  ) -> dict[str, dict[str, Cost]]:
    """Every model's cost per epoch in the paper protocol (probe "<model>": the ordinary
    step) and, with `protocol.engineered`, in the engineered one (probes "<model>
    engineered: <kind>", one per candidate step), each conversion and one m_t observation,
    all measured by interleaved probes (glai_kernels/glai/timing.py) after all training of
    this seed."""
    settings = paper_training(head)
    probes = {}
    for name, model in {**models, **glai.estimators}.items():
        kind = "adam" if name.startswith("GLAI") else "sgd"
        decay = settings.glai_weight_decay if kind == "adam" else settings.mlp_weight_decay

        def optimizer(model=model, kind=kind, decay=decay):
            return make_optimizer(kind, model.parameters(), lr=settings.lr, weight_decay=decay)
        # the paper's ordinary loop: a GLAI selector's frozen layers on torch's GEMM, as
        # the MLPs' layers run there (on_torch_gemm; a copy, so the engineered probes below
        # keep the extension's GEMM)
        paper = on_torch_gemm(model)
        probes[name] = training_probe(paper, task, optimizer(paper), steps=protocol.probe_steps,
                                      seed=seed + 7, kind="ordinary")
        if protocol.engineered:
            for step in _engineered_kinds(name, model, optimizer(), protocol):
                probes[f"{name}{ENGINEERED}{step}"] = training_probe(
                    model, task, optimizer(), steps=protocol.probe_steps, seed=seed + 7,
                    kind=step)
        if protocol.graphs:
            probes[f"{name}{GRAPHED}"] = _graphed_probe(name, model, task, optimizer(),
                                                        protocol, seed, device, graph_notes)
    for variant, convert in glai.conversions.items():
        probes[f"convert {variant}"] = once_probe(device, convert, "once")
    if "auto" in protocol.switches and glai.reduced is not None:
        watcher = StructureMonitor(glai.reference)
        watcher.observe(glai.reduced)  # the first observation has no m_t: untimed
        probes["m_t"] = once_probe(device, lambda: watcher.observe(glai.reduced), "once")
    return interleaved(probes, protocol.timing_repeats)


def _graphed_probe(name: str, model: nn.Module, task: Task, optimizer, protocol: Protocol,
                   seed: int, device: torch.device, notes: dict[str, str] | None):
    """The training probe of `model`'s ordinary step replayed from CUDA graphs; `notes[name]`
    says how its capture went (graphs captured, or why it fell back to eager steps)."""
    prepare_optimizer(optimizer, device)
    probe = training_probe(model, task, optimizer, steps=protocol.probe_steps, seed=seed + 7,
                           kind="ordinary", graphs=True)
    if notes is not None:
        graphed = probe.graphed
        notes[name] = (f"eager: {graphed.fallback}" if graphed.fallback else
                       f"{graphed.strategy.name}: {graphed.captured} capture(s)")
    return probe


def graphed_view(costs: dict[str, dict[str, Cost]]) -> dict[str, dict[str, Cost]]:
    """The graphed costs under the paper's names ("MLP", "GLAI", ...: each model's "<model>
    graphed" probe; the conversions and m_t as measured); {} when none was measured."""
    graphed = {name[: -len(GRAPHED)]: parts for name, parts in costs.items()
               if name.endswith(GRAPHED)}
    if not graphed:
        return {}
    view = {name: parts for name, parts in costs.items()
            if ENGINEERED not in name and not name.endswith(GRAPHED)}
    view.update(graphed)
    return view


def engineered_view(costs: dict[str, dict[str, Cost]], clock_name: str
                    ) -> tuple[dict[str, dict[str, Cost]], dict[str, dict[str, float]]]:
    """The engineered protocol's costs under the paper's names ("MLP", "GLAI", ...: each
    model's fastest candidate step on `clock_name`, by its least-disturbed epoch cost; the
    conversions and m_t as measured), and {model: {step kind: that epoch cost}}, every
    candidate's."""
    view = {name: parts for name, parts in costs.items()
            if ENGINEERED not in name and not name.endswith(GRAPHED)}
    candidates: dict[str, dict[str, float]] = {}
    for name, parts in costs.items():
        if ENGINEERED in name:
            model, kind = name.split(ENGINEERED)
            candidates.setdefault(model, {})[kind] = parts["epoch"].on(clock_name).seconds
    for model, kinds in candidates.items():
        view[model] = costs[f"{model}{ENGINEERED}{min(kinds, key=kinds.get)}"]
    return view, candidates


def _phases(record: dict, costs: dict[str, dict[str, Cost]], clock_name: str) -> tuple:
    """GLAI's (reduced, conversion, estimator) times to convergence on one clock."""
    model = record["model"]
    convert = costs[f"convert {_conversion(model)}"]["once"].on(clock_name)
    ran = record["wall_convert" if clock_name == "wall" else "cpu_convert"]
    reduced = record["reduced_epochs"] * costs["MLP reduced"]["train"].on(clock_name).seconds
    if record["switch"] == "auto":  # m_t is observed before training and after each epoch
        reduced += (record["reduced_epochs"] + 1) * costs["m_t"]["once"].on(clock_name).seconds
    estimator = record["estimator_epochs"] * costs[model]["epoch"].on(clock_name).seconds
    return reduced, min(ran, *convert.samples), estimator


def headline_clock(protocol: Protocol) -> str:
    """The clock of the headline time: "cpu" on a CPU device (with one thread a process's
    CPU time per epoch is its wall time on a quiet machine, and it leaves out the waits for
    a core that other work on a shared machine adds), "wall" on an accelerator (its work
    is asynchronous: the CPU's clock does not see it)."""
    if protocol.clock != "auto":
        return protocol.clock
    return "cpu" if torch.device(protocol.device).type == "cpu" else "wall"


def _times(record: dict, costs: dict[str, dict[str, Cost]], clock_name: str,
           mlp_epoch: float) -> dict:
    """One protocol's fields of a record (see `apply_costs`) from that protocol's costs."""
    model = record["model"]
    raw = costs[model]["epoch"]
    epoch = raw.on(clock_name)
    fields = dict(clock=clock_name, epoch_cost=epoch.seconds, epoch_cost_wall=raw.seconds,
                  epoch_cost_cpu=raw.cpu_seconds, epoch_cost_low=epoch.low,
                  epoch_cost_median=epoch.median, epoch_cost_high=epoch.high,
                  epoch_cost_spread=epoch.spread, cost_samples=list(epoch.samples))
    if not model.startswith("GLAI"):
        fields.update(time=record["epochs"] * epoch.seconds,
                      time_wall=record["epochs"] * raw.seconds,
                      time_cpu=record["epochs"] * raw.cpu_seconds)
        return fields
    for name in ("wall", "cpu"):
        fields[f"time_{name}"] = sum(_phases(record, costs, name))
    reduced, convert, estimator = _phases(record, costs, clock_name)
    fields.update(t_reduced=reduced, t_convert=convert, t_estimator=estimator,
                  time=reduced + convert + estimator, cost_ratio=epoch.seconds / mlp_epoch,
                  convert_share=convert / (reduced + convert + estimator))
    return fields


def apply_graphed(records: list[dict], costs: dict[str, dict[str, Cost]], clock_name: str,
                  notes: dict[str, str] | None = None) -> None:
    """Where `costs` has graphed probes, each record's fields priced by them in
    `record["graphed"]` (as `apply_costs` prices the paper protocol), with `graphs`: how the
    model's capture went."""
    view = graphed_view(costs)
    if not view or "MLP" not in view:
        return
    mlp_epoch = view["MLP"]["epoch"].on(clock_name).seconds
    for record in records:
        if record["model"] in view:
            record["graphed"] = {**_times(record, view, clock_name, mlp_epoch),
                                 "graphs": (notes or {}).get(record["model"], "")}


def apply_costs(records: list[dict], costs: dict[str, dict[str, Cost]],
                clock_name: str = "wall") -> None:
    """Set each record's time to convergence on both clocks (`time_wall`, `time_cpu`) and
    on the headline clock (`time`; GLAI's t_reduced / t_convert / t_estimator add up to
    it), its cost per epoch on the headline clock (minimum, median, range, samples), both
    clocks' minima, and GLAI's cost ratio to the MLP's epoch and conversion share: the
    paper protocol's at the record's top level; where `costs` has engineered probes, the
    engineered protocol's in `record["engineered"]`, with the step that priced it (`step`)
    and every candidate step's epoch cost (`step_costs`)."""
    mlp_epoch = costs["MLP"]["epoch"].on(clock_name).seconds
    view, candidates = engineered_view(costs, clock_name)
    fast_mlp = view["MLP"]["epoch"].on(clock_name).seconds
    for record in records:
        record.update(_times(record, costs, clock_name, mlp_epoch))
        kinds = candidates.get(record["model"])
        if kinds:
            record["engineered"] = {**_times(record, view, clock_name, fast_mlp),
                                    "step": min(kinds, key=kinds.get), "step_costs": kinds}


def run_head(head: PaperHead, data: EmbeddingSplits, seed: int, protocol: Protocol) -> list[dict]:
    """Every model of Table 3 for one (head, data, seed), then their robust costs."""
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
    glai = run_glai(head, data, task, protocol, seed, records[0]["epochs"], device)
    records.extend(glai.records)
    torch.manual_seed(1000 * seed + 3)
    linear = linear_head(head).to(device)
    records.append(run_baseline("Linear", linear, head, data, task, protocol, seed))
    notes: dict[str, str] = {}
    costs = measure_costs(head, task, protocol, seed,
                          {"MLP": original, "MLP reduced": reduced, "Linear": linear}, glai,
                          device, graph_notes=notes)
    apply_costs(records, costs, headline_clock(protocol))
    apply_graphed(records, costs, headline_clock(protocol), notes)
    order = {name: k for k, name in enumerate(MODELS)}
    return sorted(records, key=lambda r: order[r["model"]])
