"""Run a preset: every (head, data set, seed), then the reports."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import platform
import time

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
               progress: bool = True, threads: int | None = 1) -> list[dict]:
    """Run every job of `preset`, write the reports into out_dir, return the records.

    `threads`: torch's intra-op threads for the run (None: leave as is). One by default: at
    batch 16 a second thread buys little, and on a shared machine its barrier waits make
    wall clocks erratic (measured: a tiny head's run took 62 s at 2 threads with the load
    average at 6-8, 0.6 s at 1)."""
    data_files = data_files or {}
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run_config(preset, out_dir, data_files, progress)
    finally:
        torch.set_num_threads(before)


def _run_config(preset: Preset, out_dir: pathlib.Path, data_files: dict,
                progress: bool) -> list[dict]:
    warm_up(preset)
    jobs = []
    for head in preset.heads:
        sources = ("file",) if head.paper_name in data_files else preset.sources_for(head)
        jobs.extend((head, source) for source in sources)
    records, notes = [], {}
    started, cpu_started = time.perf_counter(), time.process_time()
    with tqdm(total=len(jobs) * len(preset.seeds), desc=f"GLAI pipeline ({preset.name})",
              unit="run", disable=not progress) as bar:
        for head, source in jobs:
            data = load_data(head, source, preset, data_files)
            notes[data.name] = data.description
            warm_up_shapes(head, data, preset.protocol)
            for seed in preset.seeds:
                bar.set_postfix_str(f"{head.name} on {data.name}, seed {seed}")
                records.extend(run_head(head, data, seed, preset.protocol))
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
        "python": platform.python_version(),
        "wall_seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    report.write(records, meta, out_dir)
    return records


def run_preset(name: str, out_dir: pathlib.Path, *, heads: list[str] | None = None,
               seeds: int | None = None, data_files: dict | None = None,
               switch: str | None = None, device: str | None = None,
               progress: bool = True, threads: int | None = 1) -> list[dict]:
    """A named preset, optionally narrowed (heads, seeds) or redirected (files, device,
    threads); `switch` "fixed", "auto" or "both" (the default: both, side by side)."""
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
                                   **({"switches": switches[switch]} if switch else {}))
    preset = dataclasses.replace(preset, protocol=protocol)
    return run_config(preset, out_dir, data_files=data_files, progress=progress,
                      threads=threads)
