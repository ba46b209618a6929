"""Run a preset: every (head, data set, seed), then the reports."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import multiprocessing.process
import os
import pathlib
import pickle
import platform
import tempfile
import time
from collections.abc import Callable

import torch

from bench.harness import shards
from bench.harness.progress import EtaBar
from bench.pipeline import report
from bench.pipeline.data import digits, load_embeddings, synthetic
from bench.pipeline.presets import PRESETS, Preset
from glai_kernels.glai import reduce_mlp
from glai_kernels.glai.embeddings import EmbeddingSplits
from glai_kernels.glai.protocol import (
    Protocol,
    linear_head,
    make_task,
    original_mlp,
    run_baseline,
    run_head,
)
from glai_kernels.paper_heads import PAPER_HEADS, PaperHead


def load_data(head: PaperHead, source: str, preset: Preset, data_files: dict) -> EmbeddingSplits:
    if source == "file":
        data = load_embeddings(data_files[head.paper_name], need_labels=head.family != "B")
    elif source == "synthetic":
        data = synthetic(head, preset.sizes[head.family])
    elif source == "digits":
        data = digits(head)
    else:
        raise ValueError(f"unknown data source {source!r}")
    if data.dim != head.n0:
        raise ValueError(f"{head.name}: embeddings have {data.dim} dims, the head takes {head.n0}")
    return data


def warm_up(preset: Preset) -> None:
    """One untimed epoch of every model on a tiny head of each family, so one-off costs
    (first calls into optimizers, the custom op, kernel selection) land in no timed run."""
    protocol = dataclasses.replace(
        preset.protocol, max_epochs=1, max_epochs_b=1, max_epochs_c=1, reference_size=64,
        episodes_per_epoch=2, val_episodes=2, timing_repeats=1, probe_steps=2,
        # a tiny head's kept fraction is large: force the sparse op so it is warm too
        layout="dense" if preset.protocol.layout == "dense" else "sparse")
    families = {}
    for head in preset.heads:
        families.setdefault(head.family, head)
    for head in families.values():
        tiny = dataclasses.replace(head, name=f"{head.name}-warmup", n0=12, n1=16,
                                   n2=min(head.n2, 6))
        sizes = {"train": 32, "val": 32, "test": 8, "per_class": 16}
        run_head(tiny, synthetic(tiny, sizes), 0, protocol)


def warm_up_shapes(head: PaperHead, data: EmbeddingSplits, protocol: Protocol) -> None:
    """One untimed epoch of the MLPs and the linear head at this head's real sizes: the first
    matmuls of a new shape pay one-off setup (seconds, measured) that would otherwise land in
    the first seed's original-MLP time."""
    protocol = dataclasses.replace(protocol, max_epochs=1, max_epochs_b=1, max_epochs_c=1,
                                   episodes_per_epoch=2, val_episodes=2)
    task = make_task(head, data, protocol, 0, torch.device(protocol.device))
    for model in (original_mlp(head), reduce_mlp(original_mlp(head), head.rho),
                  linear_head(head)):
        run_baseline("warm-up", model.to(protocol.device), head, data, task, protocol, 0)


def run_config(preset: Preset, out_dir: pathlib.Path, *, data_files: dict | None = None,
               progress: bool = True, threads: int | None = 1, jobs: int = 1,
               shard: shards.Shard | None = None,
               unit_time_limit_s: float | None = None,
               time_limit_s: float | None = None) -> list[dict]:
    """Run every job of `preset`, write the reports into out_dir, return the records.

    `threads`: torch's intra-op threads for the run (None: leave as is). One by default: at
    batch 16 a second thread buys little, and on a shared machine its barrier waits make
    wall clocks erratic (measured: a tiny head's run took 62 s at 2 threads with the load
    average at 6-8, 0.6 s at 1).

    `jobs`: how many (head, data set, seed) units run at once, each in a fresh process of
    its own (warm-ups included). A unit's records do not depend on `jobs` (training is
    deterministic per seed and each unit measures its own costs by interleaved probes), so
    jobs > 1 only shortens the wall clock; the longest units (family B) start first.

    `shard`: only that shard's units (`shards.split` by `unit_cost`), named in the report.
    `unit_time_limit_s`: each unit in a process of its own (also with jobs = 1), killed past
    that many seconds and listed in the report as cut off. The report is rewritten, each
    file in one rename, after every unit, so a run cut off by its lease leaves its finished
    units' records (results.json) and tables.
    `time_limit_s`: the whole run ends by itself within that many seconds of this call, its
    report written: units in processes of their own (also with jobs = 1), a unit not started
    when what is left after the report's reserve cannot hold it (`RunClock.starts`), one
    still running at the run's end stopped; the report names both."""
    started = time.monotonic()
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    for name, value in (("unit_time_limit_s", unit_time_limit_s),
                        ("time_limit_s", time_limit_s)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    data_files = data_files or {}
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        clock = None if time_limit_s is None else RunClock(started + time_limit_s,
                                                           time_limit_s)
        return _run_config(preset, out_dir, data_files, progress, threads, jobs, shard,
                           unit_time_limit_s, clock)
    finally:
        torch.set_num_threads(before)


@dataclasses.dataclass(frozen=True)
class Unit:
    """One (head, data source, seed) of a preset: the smallest independent piece of a run."""

    head: PaperHead
    source: str
    seed: int


def units_of(preset: Preset, data_files: dict) -> list[Unit]:
    """The preset's units, heads in preset order, each head's sources, then seeds."""
    units = []
    for head in preset.heads:
        sources = ("file",) if head.paper_name in data_files else preset.sources_for(head)
        units.extend(Unit(head, source, seed) for source in sources for seed in preset.seeds)
    return units


def unit_cost(preset: Preset, unit: Unit) -> float:
    """A unit's relative run time, for balancing shards (`shards.split`): its head's size
    (the original MLP's weights) times its family's epoch cap times the examples an epoch
    sees (episodes for C)."""
    head, protocol = unit.head, preset.protocol
    cap = {"A": protocol.max_epochs, "B": protocol.max_epochs_b,
           "C": protocol.max_epochs_c}.get(head.family, protocol.max_epochs)
    size = preset.sizes.get(head.family, {})
    examples = size.get("train") or protocol.episodes_per_epoch * size.get("per_class", 1)
    return float((head.n0 * head.n1 + head.n1 * head.n2) * cap * examples)


def bar_costs(preset: Preset, units: list[Unit]) -> tuple[dict[Unit, float], float | None]:
    """The progress bar's cost of each unit and its prior seconds per unit of cost, one unit
    running at a time (bench/harness/progress.py): on the CPU, the preset's measured seconds
    of each unit (`unit_seconds`, by head and seed, synthetic data) where it has every
    unit's, at 1 s a second; else `unit_cost` at the preset's `seconds_per_cost`. unit_cost
    prices a unit by its epoch cap, so it misses what early stopping and each unit's fixed
    work make of it: on the first-run preset it rates C1's unit at 1/37 of B1's, against 1/9
    and 1/19 measured for B1's two seeds (docs/notes/benchmarks.md, "The bars' estimates on
    a quiet first run (stop 51)")."""
    table = preset.unit_seconds if preset.protocol.device == "cpu" else None  # CPU-measured
    if table and all(u.source == "synthetic" and (u.head.name, u.seed) in table for u in units):
        return {u: float(table[u.head.name, u.seed]) for u in units}, 1.0
    return {u: unit_cost(preset, u) for u in units}, preset.seconds_per_cost


def unit_label(unit: Unit) -> str:
    return f"{unit.head.name} on {unit.source}, seed {unit.seed}"


def _run_unit(preset: Preset, unit: Unit, data_files: dict,
              threads: int | None) -> tuple[list[dict], str, str, float]:
    """A unit in this (fresh) process: its warm-ups, then run_head; (records, data set name,
    its description, this process's CPU seconds)."""
    cpu = time.process_time()
    if threads is not None:
        torch.set_num_threads(threads)
    warm_up(dataclasses.replace(preset, heads=(unit.head,)))
    data = load_data(unit.head, unit.source, preset, data_files)
    warm_up_shapes(unit.head, data, preset.protocol)
    records = run_head(unit.head, data, unit.seed, preset.protocol)
    return records, data.name, data.description, time.process_time() - cpu


def _unit_process(preset: Preset, unit: Unit, data_files: dict, threads: int | None,
                  result: pathlib.Path) -> None:
    """A unit's process: `_run_unit`, its outcome pickled into `result` in one rename (a
    process killed at its time limit leaves no half-written file)."""
    outcome = _run_unit(preset, unit, data_files, threads)
    partial = result.with_suffix(".tmp")
    partial.write_bytes(pickle.dumps(outcome))
    os.replace(partial, result)


def _family_first(unit: Unit) -> int:
    # B's units are the longest (docs/notes/pipeline.md, "Reproduction stability"): start them first
    return {"B": 0, "C": 1}.get(unit.head.family, 2)


def launch_order(units: list[Unit], limited: bool) -> list[Unit]:
    """The order units start in: the longest families first (the shortest wall clock when
    every unit runs); under a run's time limit (`limited`), seed by seed, each seed's longest
    families first, so the units a limit leaves out are the later seeds' and every head gets
    its first seed (docs/notes/benchmarks.md, "A first run sized to the machine (issue 41
    item 3, stop 54)")."""
    if not limited:
        return sorted(units, key=_family_first)
    return sorted(units, key=lambda unit: (unit.seed, _family_first(unit)))


Done = Callable[[Unit, "tuple[list[dict], str, str, float] | None", str], None]
# the report's reserve before its first write is timed: 2 s measured for ten records on this
# project's 2-core CPU (six PNG figures), about twice that
REPORT_RESERVE_S = 5.0


@dataclasses.dataclass
class RunClock:
    """A pipeline run's time limit: `end` (time.monotonic()) by which it has ended, its report
    written; `report_s` the reserve for that last write (twice the slowest write so far, at
    least REPORT_RESERVE_S). `priors`: each unit's expected wall seconds where the preset
    prices its units (`bar_costs`); `pace`: the largest ratio of an ended unit's seconds to
    its prior so far, this machine's pace against the machine the priors came from."""

    end: float
    limit_s: float
    report_s: float = REPORT_RESERVE_S
    longest_unit_s: float = 0.0
    priors: dict = dataclasses.field(default_factory=dict)
    pace: float = 0.0

    def work_left_s(self) -> float:
        """Seconds a unit may still run: to the end, less the report's reserve."""
        return self.end - self.report_s - time.monotonic()

    def need_s(self, unit_limit_s: float | None, unit: Unit | None = None) -> float:
        """The seconds a unit is expected to need, at most the unit time limit: before any
        unit has ended, nothing but that limit; after, its prior at the pace seen so far
        where it has a prior, else half as long again as the longest unit so far."""
        need = unit_limit_s if unit_limit_s is not None else 0.0
        if self.pace > 0 and unit in self.priors:
            return min(need or math.inf, self.pace * self.priors[unit])
        if self.longest_unit_s > 0:
            need = min(need or math.inf, 1.5 * self.longest_unit_s)
        return need

    def starts(self, unit_limit_s: float | None, unit: Unit | None = None) -> bool:
        """Whether `unit` can finish in what is left (`need_s`)."""
        return self.work_left_s() >= self.need_s(unit_limit_s, unit)

    def ended(self, unit: Unit, seconds: float) -> None:
        """A unit ended after `seconds` of wall clock: the longest so far, and the pace."""
        self.longest_unit_s = max(self.longest_unit_s, seconds)
        if self.priors.get(unit, 0) > 0:
            self.pace = max(self.pace, seconds / self.priors[unit])

    def wrote(self, seconds: float) -> None:
        self.report_s = max(self.report_s, 2 * seconds)



def _run_processes(preset: Preset, units: list[Unit], data_files: dict, threads: int | None,
                   jobs: int, limit_s: float | None, done: Done,
                   on_start: Callable[[Unit], None] | None = None,
                   clock: RunClock | None = None) -> None:
    """Each unit in a fresh process of its own, `jobs` at once, in `launch_order`; one
    running past `limit_s` seconds is killed. `done(unit, outcome, status)` is called as
    each ends, status "ok" (outcome its `_run_unit` result), "timed out" or "failed"
    (outcome None); `on_start(unit)` as each starts. With `clock`, a unit it says cannot
    finish is not started (status "not run"; a later, shorter one may still be) and one
    still running at its end is killed (status "run limit")."""
    context = multiprocessing.get_context("spawn")  # no forked torch/OpenMP state
    waiting = launch_order(units, limited=clock is not None)
    running: dict[Unit, tuple[multiprocessing.process.BaseProcess, float, pathlib.Path]] = {}
    with tempfile.TemporaryDirectory(prefix="glai-units-") as tmp:
        try:
            while waiting or running:
                while waiting and len(running) < jobs:
                    unit = waiting.pop(0)
                    if clock is not None and not clock.starts(limit_s, unit):
                        done(unit, None, "not run")
                        continue
                    result = pathlib.Path(tmp) / f"unit-{len(units) - len(waiting)}.pkl"
                    process = context.Process(target=_unit_process, daemon=True,
                                              args=(preset, unit, data_files, threads, result))
                    process.start()
                    running[unit] = (process, time.monotonic(), result)
                    if on_start is not None:
                        on_start(unit)
                time.sleep(0.05)
                for unit, (process, began, result) in list(running.items()):
                    if process.is_alive():
                        over_run = clock is not None and clock.work_left_s() < 0
                        if not over_run and (limit_s is None
                                             or time.monotonic() - began < limit_s):
                            continue
                        _stop(process)
                        del running[unit]
                        done(unit, None, "run limit" if over_run else "timed out")
                        continue
                    process.join()
                    del running[unit]
                    if clock is not None:
                        clock.ended(unit, time.monotonic() - began)
                    if process.exitcode == 0 and result.exists():
                        done(unit, pickle.loads(result.read_bytes()), "ok")
                    else:
                        done(unit, None, "failed")
        finally:  # interrupted (Ctrl-C, a lease's SIGTERM): no unit outlives the run
            for process, _, _ in running.values():
                _stop(process)


def _stop(process: multiprocessing.process.BaseProcess) -> None:
    process.terminate()
    process.join(5)
    if process.is_alive():
        process.kill()
        process.join()


class _Collector:
    """The run's records as its units end, in the preset's unit order, and its report
    rewritten after each (`write`): a run cut off by its lease leaves the finished units'
    records and a report of them."""

    def __init__(self, preset: Preset, out_dir: pathlib.Path, units: list[Unit],
                 meta: dict, bar, clock: RunClock | None = None) -> None:
        self.preset, self.out_dir, self.units, self.meta, self.bar = (preset, out_dir, units,
                                                                      meta, bar)
        self.clock = clock
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        self.records: dict[Unit, list[dict]] = {}
        self.notes: dict[str, str] = {}
        self.cpu = 0.0
        self.timed_out: list[str] = []
        self.failed: list[str] = []
        self.not_run: list[str] = []  # not started: the run's time limit
        self.cut: list[str] = []  # stopped at the run's time limit
        self.seconds: dict[str, float] = {}  # each ended unit's wall seconds, by label

    def done(self, unit: Unit, outcome, status: str) -> None:
        seconds = self.bar.item_seconds(unit)  # None: never started (the run's time limit)
        if seconds is not None:
            self.seconds[unit_label(unit)] = round(seconds, 2)
        if outcome is not None:
            records, name, description, cpu = outcome
            self.records[unit] = records
            self.notes[name] = description
            self.cpu += cpu
        elif status == "not run":
            self.not_run.append(unit_label(unit))
            return  # never started: nothing to show on the bar, nothing new to write
        else:
            {"timed out": self.timed_out, "run limit": self.cut}.get(
                status, self.failed).append(unit_label(unit))
        self.bar.finish(unit)
        ended = (len(self.records) + len(self.timed_out) + len(self.failed) + len(self.cut)
                 + len(self.not_run))
        if ended < len(self.units):
            self.write(partial=True)

    def all_records(self) -> list[dict]:
        return [r for unit in self.units for r in self.records.get(unit, [])]

    def write(self, partial: bool = False) -> None:
        """The report of the records so far, each file replaced in one rename (with no
        record, a run that had units cut off or not run still writes its README saying so)."""
        if not self.records and not (self.timed_out or self.failed or self.cut
                                     or self.not_run):
            return
        began = time.monotonic()
        meta = {**self.meta, "data": self.notes,
                "wall_seconds": time.perf_counter() - self.started,
                # with units in processes, the CPU time is theirs (this process only waits)
                "cpu_seconds": time.process_time() - self.cpu_started + self.cpu,
                "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                "units": {"planned": [unit_label(u) for u in self.units],
                          "done": [unit_label(u) for u in self.units if u in self.records],
                          "timed_out": self.timed_out, "failed": self.failed,
                          "not_run": self.not_run, "cut_off": self.cut,
                          "partial": partial,
                          # each ended unit's wall seconds, start to end (what the
                          # first-run preset's `unit_seconds` were measured from)
                          "seconds": self.seconds}}
        write_report_atomically(self.all_records(), meta, self.out_dir)
        if self.clock is not None:
            self.clock.wrote(time.monotonic() - began)


def coverage_note(meta: dict) -> str | None:
    """The README's line on a report of part of a run (a shard, a unit cut off, a run still
    going, a merge that lacks shards or found a unit twice), or None for a whole one."""
    units, shard = meta.get("units") or {}, meta.get("shard")
    parts = []
    if shard:
        parts.append(f"shard {shard['number']} of {shard['count']} (from {shard['source']}): "
                     "`glai-bench merge --pipeline` joins the shards' folders")
    if units.get("partial"):
        parts.append(f"written while running: {len(units['done'])} of {len(units['planned'])} "
                     "units finished so far")
    if units.get("timed_out"):
        parts.append(f"cut off at the unit time limit of {meta.get('unit_time_limit_s')} s, "
                     f"so not in the tables: {'; '.join(units['timed_out'])}")
    if units.get("failed"):
        parts.append(f"failed, so not in the tables: {'; '.join(units['failed'])}")
    limit = meta.get("time_limit_s")
    limit = f"{limit:.0f}" if isinstance(limit, int | float) else limit
    if units.get("cut_off"):
        parts.append(f"stopped at the run's time limit of {limit} s, so not "
                     f"in the tables: {'; '.join(units['cut_off'])}")
    if units.get("not_run"):
        parts.append(f"not run, the run's time limit of {limit} s leaving too little for "
                     f"them, so the tables' means are over the units that ran: "
                     f"{'; '.join(units['not_run'])}")
    missing = (meta.get("shards") or {}).get("missing")
    if missing:
        parts.append(f"merged without shard(s) {', '.join(map(str, missing))} of "
                     f"{meta['shards']['count']}, whose units are not in the tables")
    parts.extend(meta.get("merge_notes") or [])
    return ("**Part of a run**: " + ". ".join(parts) + ".") if parts else None


def write_report_atomically(records: list[dict], meta: dict, out_dir: pathlib.Path) -> None:
    """`report.write` into a staging folder, the README told what the report covers
    (`coverage_note`), then each file moved into `out_dir` with one rename: a reader (or a
    lease's end) never sees a half-written file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".staging-", dir=out_dir) as tmp:
        staging = pathlib.Path(tmp)
        if records:
            report.write(records, meta, staging)
        else:  # no unit finished: what was planned and why none is in a table
            (staging / "README.md").write_text("# GLAI pipeline: no unit finished\n")
            (staging / "results.json").write_text(
                json.dumps({"meta": meta, "records": []}, indent=1, default=str) + "\n")
        note = coverage_note(meta)
        readme = staging / "README.md"
        if note and readme.exists():
            head, _, rest = readme.read_text().partition("\n")
            readme.write_text(f"{head}\n\n{note}\n{rest}")
        for path in sorted(staging.iterdir()):
            os.replace(path, out_dir / path.name)


def _run_config(preset: Preset, out_dir: pathlib.Path, data_files: dict,
                progress: bool, threads: int | None = 1, jobs: int = 1,
                shard: shards.Shard | None = None,
                unit_time_limit_s: float | None = None,
                clock: RunClock | None = None) -> list[dict]:
    every = units_of(preset, data_files)
    units = shards.split(every, lambda u: unit_cost(preset, u), shard)
    if not units:
        raise ValueError(f"shard {shard.number}/{shard.count} has no unit: the run has only "
                         f"{len(every)}")
    meta = {
        "preset": preset.name,
        "protocol": dataclasses.asdict(preset.protocol),
        "sizes": preset.sizes,
        "seeds": list(preset.seeds),
        "device": preset.protocol.device,
        "device_name": (torch.cuda.get_device_name() if preset.protocol.device == "cuda"
                        else platform.processor() or platform.machine()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "jobs": jobs,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        **({"shard": shard.provenance()} if shard else {}),
        **({"unit_time_limit_s": unit_time_limit_s} if unit_time_limit_s else {}),
        **({"time_limit_s": clock.limit_s} if clock else {}),
    }
    # the bar's estimate of the time left weighs each unit by `bar_costs` (its prior: the
    # preset's measured seconds per unit of cost, scaled by the units run at once)
    at_once = max(1, min(jobs, len(units)))
    costs, seconds_per_cost = bar_costs(preset, units)
    prior = None if seconds_per_cost is None else seconds_per_cost / at_once
    if clock is not None and seconds_per_cost is not None:
        clock.priors = {unit: costs[unit] * seconds_per_cost for unit in units}
    with EtaBar(costs, desc=f"GLAI pipeline ({preset.name})", unit="run",
                disable=not progress, prior_s_per_cost=prior, jobs=at_once) as bar:
        collector = _Collector(preset, out_dir, units, meta, bar, clock)
        if jobs > 1 or unit_time_limit_s is not None or clock is not None:
            _run_processes(preset, units, data_files, threads, jobs, unit_time_limit_s,
                           collector.done, lambda unit: bar.start(unit, unit_label(unit)),
                           clock)
        else:
            warm_up(preset)
            loaded = {}
            for unit in units:
                key = (unit.head.name, unit.source)
                if key not in loaded:
                    loaded[key] = load_data(unit.head, unit.source, preset, data_files)
                    warm_up_shapes(unit.head, loaded[key], preset.protocol)
                data = loaded[key]
                bar.start(unit, f"{unit.head.name} on {data.name}, seed {unit.seed}")
                records = run_head(unit.head, data, unit.seed, preset.protocol)
                collector.done(unit, (records, data.name, data.description, 0.0), "ok")
    collector.write()
    if collector.failed:
        raise RuntimeError(f"{len(collector.failed)} unit(s) failed (the report has the "
                           f"others): {'; '.join(collector.failed)}")
    return collector.all_records()


def run_preset(name: str, out_dir: pathlib.Path, *, heads: list[str] | None = None,
               seeds: int | None = None, data_files: dict | None = None,
               switch: str | None = None, device: str | None = None,
               progress: bool = True, threads: int | None = 1,
               jobs: int | None = None, compile_mlp: bool | None = None,
               shard: shards.Shard | None = None,
               unit_time_limit_s: float | None = None,
               graphs: bool | None = None,
               time_limit_s: float | None = None) -> list[dict]:
    """A named preset, optionally narrowed (heads, seeds) or redirected (files, device,
    threads); `switch` "fixed", "auto" or "both" (the default: both, side by side); `jobs`
    units at once (None: `default_jobs`); `compile_mlp` False leaves torch.compile out of
    the engineered MLP step's candidates (None: the preset's choice); `shard`,
    `unit_time_limit_s` and `time_limit_s` as `run_config`'s; `graphs` prices every model's
    step replayed from CUDA graphs too (`Protocol.graphs`; None: on a CUDA device, where
    launches are the cost)."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
    preset = PRESETS[name]
    if heads:
        unknown = sorted(set(heads) - set(PAPER_HEADS))
        if unknown:
            raise ValueError(f"unknown heads {unknown}; the paper's are {sorted(PAPER_HEADS)}")
        preset = dataclasses.replace(preset, heads=tuple(PAPER_HEADS[h] for h in heads))
    if seeds is not None:
        preset = dataclasses.replace(preset, seeds=tuple(range(seeds)))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    switches = {"fixed": ("fixed",), "auto": ("auto",), "both": ("fixed", "auto")}
    if switch is not None and switch not in switches:
        raise ValueError(f"switch must be one of {sorted(switches)}, got {switch!r}")
    protocol = dataclasses.replace(preset.protocol, device=device,
                                   **({"switches": switches[switch]} if switch else {}),
                                   **({} if compile_mlp is None else
                                      {"compile_mlp": compile_mlp}),
                                   graphs=(torch.device(device).type == "cuda"
                                           if graphs is None else graphs))
    preset = dataclasses.replace(preset, protocol=protocol)
    if jobs is None:
        jobs = default_jobs(device, threads)
    return run_config(preset, out_dir, data_files=data_files, progress=progress,
                      threads=threads, jobs=jobs, shard=shard,
                      unit_time_limit_s=unit_time_limit_s, time_limit_s=time_limit_s)


def default_jobs(device: str, threads: int | None) -> int:
    """On CPU, one unit per core this process may use (each runs `threads` threads, 1 by
    default); on an accelerator one (units would share the device and each other's clocks)."""
    if device != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, threads or 1))
