"""Run a preset: every (head, data set, seed), then the reports."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pathlib
import platform
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch
from tqdm import tqdm

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
               progress: bool = True, threads: int | None = 1, jobs: int = 1) -> list[dict]:
    """Run every job of `preset`, write the reports into out_dir, return the records.

    `threads`: torch's intra-op threads for the run (None: leave as is). One by default: at
    batch 16 a second thread buys little, and on a shared machine its barrier waits make
    wall clocks erratic (measured: a tiny head's run took 62 s at 2 threads with the load
    average at 6-8, 0.6 s at 1).

    `jobs`: how many (head, data set, seed) units run at once, each in a fresh process of
    its own (warm-ups included). A unit's records do not depend on `jobs` (training is
    deterministic per seed and each unit measures its own costs by interleaved probes), so
    jobs > 1 only shortens the wall clock; the longest units (family B) start first."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    data_files = data_files or {}
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run_config(preset, out_dir, data_files, progress, threads, jobs)
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


def _family_first(unit: Unit) -> int:
    # B's units are the longest (bench/NOTES.md, "Reproduction stability"): start them first
    return {"B": 0, "C": 1}.get(unit.head.family, 2)


def _run_parallel(preset: Preset, units: list[Unit], data_files: dict, threads: int | None,
                  jobs: int, bar) -> tuple[list[dict], dict, float]:
    results: dict[Unit, list[dict]] = {}
    notes, cpu = {}, 0.0
    context = multiprocessing.get_context("spawn")  # no forked torch/OpenMP state
    with ProcessPoolExecutor(jobs, mp_context=context, max_tasks_per_child=1) as pool:
        futures = {pool.submit(_run_unit, preset, unit, data_files, threads): unit
                   for unit in sorted(units, key=_family_first)}
        for future in as_completed(futures):
            records, name, description, unit_cpu = future.result()
            results[futures[future]] = records
            notes[name], cpu = description, cpu + unit_cpu
            bar.update()
    return [r for unit in units for r in results[unit]], notes, cpu


def _run_config(preset: Preset, out_dir: pathlib.Path, data_files: dict,
                progress: bool, threads: int | None = 1, jobs: int = 1) -> list[dict]:
    units = units_of(preset, data_files)
    records, notes = [], {}
    started, cpu_started = time.perf_counter(), time.process_time()
    with tqdm(total=len(units), desc=f"GLAI pipeline ({preset.name})",
              unit="run", disable=not progress) as bar:
        if jobs > 1:
            records, notes, unit_cpu = _run_parallel(preset, units, data_files, threads,
                                                     jobs, bar)
        else:
            warm_up(preset)
            unit_cpu, loaded = 0.0, {}
            for unit in units:
                key = (unit.head.name, unit.source)
                if key not in loaded:
                    loaded[key] = load_data(unit.head, unit.source, preset, data_files)
                    warm_up_shapes(unit.head, loaded[key], preset.protocol)
                data = loaded[key]
                notes[data.name] = data.description
                bar.set_postfix_str(f"{unit.head.name} on {data.name}, seed {unit.seed}")
                records.extend(run_head(unit.head, data, unit.seed, preset.protocol))
                bar.update()
    meta = {
        "preset": preset.name,
        "protocol": dataclasses.asdict(preset.protocol),
        "sizes": preset.sizes,
        "seeds": list(preset.seeds),
        "data": notes,
        "device": preset.protocol.device,
        "device_name": (torch.cuda.get_device_name() if preset.protocol.device == "cuda"
                        else platform.processor() or platform.machine()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "jobs": jobs,
        "python": platform.python_version(),
        "wall_seconds": time.perf_counter() - started,
        # with jobs > 1: the units' processes' CPU time (this process only waits)
        "cpu_seconds": time.process_time() - cpu_started + unit_cpu,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    report.write(records, meta, out_dir)
    return records


def run_preset(name: str, out_dir: pathlib.Path, *, heads: list[str] | None = None,
               seeds: int | None = None, data_files: dict | None = None,
               switch: str | None = None, device: str | None = None,
               progress: bool = True, threads: int | None = 1,
               jobs: int | None = None, compile_mlp: bool | None = None) -> list[dict]:
    """A named preset, optionally narrowed (heads, seeds) or redirected (files, device,
    threads); `switch` "fixed", "auto" or "both" (the default: both, side by side); `jobs`
    units at once (None: `default_jobs`); `compile_mlp` False leaves torch.compile out of
    the engineered MLP step's candidates (None: the preset's choice)."""
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
                                      {"compile_mlp": compile_mlp}))
    preset = dataclasses.replace(preset, protocol=protocol)
    if jobs is None:
        jobs = default_jobs(device, threads)
    return run_config(preset, out_dir, data_files=data_files, progress=progress,
                      threads=threads, jobs=jobs)


def default_jobs(device: str, threads: int | None) -> int:
    """On CPU, one unit per core this process may use (each runs `threads` threads, 1 by
    default); on an accelerator one (units would share the device and each other's clocks)."""
    if device != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, threads or 1))
