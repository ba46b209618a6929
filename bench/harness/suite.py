"""The kernel suite end to end: backends, ceilings, every case, then the report files.

    run(preset="first-run", device="cpu", out_dir=Path("reports/bench/cpu"))
    -> RunOutput with the table and the paths written

Writes into `out_dir`: results.csv, results.json, summary.md and plots/*.png. The seconds of
each phase (set-up, ceilings, the cases, the closing ceilings, the reports) are in
meta["phases"].
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from bench.harness import budget as budget_mod
from bench.harness import ceilings as ceilings_mod
from bench.harness import kept, memory, peers, provenance, results, shards
from bench.harness.budget import Budget
from bench.harness.ceilings import Ceilings
from bench.harness.energy import MIN_WINDOW_S, EnergyMeter
from bench.harness.passes import dtype_of
from bench.harness.progress import Phases
from bench.harness.runner import Context, cases_for, run_cases, select_backends
from bench.harness.stopping import RowsWriter, Stopped, closing_notes, stop_on_signals
from bench.harness.sweeps import DEFAULT_PRESET, PRESETS, Case, Preset
from glai_kernels import registry
from glai_kernels.sparse import SPARSE_ESTIMATOR


@dataclass
class RunOutput:
    table: pd.DataFrame
    meta: dict
    files: list[Path] = field(default_factory=list)


def resolve_device(name: str | None) -> torch.device:
    """`cuda` when present and not told otherwise; asking for an absent CUDA is an error."""
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device here (torch.cuda.is_available() is "
                         "False)")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {name!r}")
    return device


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None


# a pass's calls relative to a forward call (backward: two matmuls' worth, as the roofline)
_PASS_WEIGHT = {"forward": 1.0, "backward": 2.0, "both": 3.0}
# multiply-adds a CPU core does in about the time a measurement's fixed costs take (rounds,
# warm-up, the checks): a small case costs that, a large one its arithmetic on top
_FIXED_MACS = 1e8


def case_cost(case: Case) -> float:
    """A case's relative measuring time, for balancing shards (`shards.split`), the progress
    bar and a time limit's estimates: per pass, a fixed cost plus its multiply-adds B*I*P*O
    (the roofline's compute floor up to the machine's peak, which is the same for every case
    of a run) and its weight's size."""
    s = case.shape
    work = s.batch * s.inputs * s.paths * s.outputs + s.inputs * s.paths * s.outputs
    if case.mu is not None:
        # a kept-fraction case times the dense backends and the MLP (the whole work) beside
        # the sparse ones (μ of it): priced by μ alone, B1's shapes at μ ≈ 1% took 16 s where
        # their price came to about 3 s (docs/notes/benchmarks.md, "The bars' estimates on a
        # quiet first run (stop 51)")
        work *= 1 + case.mu
    return sum(_PASS_WEIGHT.get(p, 1.0) for p in case.passes) * (_FIXED_MACS + work)


def check_arguments(*, threads: int | None, rounds: int | None, min_time_s: float | None,
                    max_call_s: float | None, time_limit_s: float | None,
                    energy_window_s: float, batches: Sequence[int] | None) -> None:
    """Raise ValueError naming the first of `run`'s numeric arguments out of range, before
    anything is measured (torch.set_num_threads(0) would raise a bare RuntimeError, zero
    rounds a ZeroDivisionError after the ceilings were timed)."""
    positive = {"threads": threads, "rounds": rounds, "min_time_s": min_time_s,
                "max_call_s": max_call_s, "time_limit_s": time_limit_s}
    for name, value in positive.items():
        if value is not None and not value > 0:  # `not >` also catches NaN
            raise ValueError(f"{name} must be positive, got {value!r}")
    if not energy_window_s >= 0:
        raise ValueError(f"energy_window_s must be 0 (off) or positive, got {energy_window_s!r}")
    for batch in batches or ():
        if not batch > 0:
            raise ValueError(f"batches must be positive, got {batch!r}")


def run(preset: str | Preset = DEFAULT_PRESET, *, device: str | None = None,
        backends: Sequence[str] | None = None, dtypes: Sequence[str] | None = None,
        passes: Sequence[str] | None = None, heads: Sequence[str] | None = None,
        batches: Sequence[int] | None = None, sweeps: Sequence[str] | None = None,
        rounds: int | None = None,
        min_time_s: float | None = None, max_call_s: float | None = None,
        out_dir: Path | None = None,
        plots: bool = True, progress: bool = True, seed: int = 0,
        threads: int | None = None, command: str | None = None,
        peer_names: Sequence[str] | None = None, install_dispatch: bool = False,
        time_limit_s: float | None = None, energy_window_s: float = MIN_WINDOW_S,
        shard: shards.Shard | None = None,
        log: Callable[[str], None] = print) -> RunOutput:
    """Run the kernel suite; write its files to `out_dir` when given.

    `backends` may name the sparse op's as "sparse:NAME" (the kept-fraction sweep runs every
    available one unless some are named); `heads`/`batches`/`sweeps` keep only those cases
    of the preset; `rounds`/`min_time_s`/`max_call_s` override its timing and its per-call
    limit; `threads` sets torch's CPU threads (default: torch's choice, all cores);
    `peer_names` the bench-only peers to time beside the backends (bench/harness/peers.py; default:
    the preset's). With `out_dir`, the run's dispatch table for `auto` is written to
    out_dir/dispatch/ (bench/harness/dispatch_table.py) and, with `install_dispatch`, copied into
    glai_kernels/dispatch/, which the package ships. `time_limit_s` bounds the whole run
    from this call, its closing work included (bench/harness/budget.py): a shape or backend
    whose estimate does not fit the time left less the closing ceilings and reports is not
    started (a skipped row saying why), the closing ceilings are skipped when they do not fit
    (meta["time_limit"] and the ceilings' details say so), and results.csv/.json are written
    as the shapes end, so even a killed run leaves its rows. SIGTERM or SIGINT stops it the
    same way, the reports written, then raises `Stopped` (exit status 128 + the signal's
    number). `energy_window_s` is each NVML energy reading's window (0:
    none). `shard` keeps only that shard's part of the cases (`shards.split` by `case_cost`;
    ValueError when it has none) and names it in the provenance.
    """
    started, started_mono = time.perf_counter(), time.monotonic()
    phases = Phases()
    check_arguments(threads=threads, rounds=rounds, min_time_s=min_time_s,
                    max_call_s=max_call_s, time_limit_s=time_limit_s,
                    energy_window_s=energy_window_s, batches=batches)
    if threads is not None:
        torch.set_num_threads(threads)
    preset = get_preset(preset) if isinstance(preset, str) else preset
    if rounds is not None:
        preset = dataclasses.replace(preset, rounds=rounds)
    if min_time_s is not None:
        preset = dataclasses.replace(preset, min_time_s=min_time_s)
    if max_call_s is not None:
        preset = dataclasses.replace(preset, max_call_s=max_call_s)
    dev = resolve_device(device)
    cases = cases_for(preset, dtypes, passes, heads, batches, sweeps)
    if shard is not None:
        total, cases = len(cases), shards.split(cases, case_cost, shard)
        if not cases:
            raise ValueError(f"shard {shard.number}/{shard.count} has no case: the run has "
                             f"only {total}")
    # "sparse:NAME" names a backend of the sparse op, for the kept-fraction sweep
    sparse_requested = [b.removeprefix(kept.SPARSE_PREFIX) for b in backends or ()
                        if b.startswith(kept.SPARSE_PREFIX)]
    for name in sparse_requested:
        SPARSE_ESTIMATOR.get(name)  # an unknown name raises, listing the registered ones
    dense_requested = [b for b in backends or () if not b.startswith(kept.SPARSE_PREFIX)]
    names, unavailable = select_backends(dense_requested or None, dev, log)
    sparse_names: list[str] = []
    if any(c.mu is not None for c in cases):
        kept_dtype = dtype_of(next(c.dtype for c in cases if c.mu is not None))
        sparse_names, sparse_unavailable = kept.sparse_backends(dev, kept_dtype,
                                                                sparse_requested or None)
        unavailable.update(sparse_unavailable)
    peer_run, peer_unavailable = peers.select(
        preset.peers if peer_names is None else peer_names, dev, log)
    unavailable.update(peer_unavailable)
    info = provenance.collect(dev)
    if shard is not None:
        info["shard"] = shard.provenance()
    if dev.type == "cpu" and info["load_average"] > torch.get_num_threads() / 2:
        hint = "; --threads 1 suffers least from it" if torch.get_num_threads() > 1 else ""
        log(f"note: load average {info['load_average']} on {info['cpu_count']} cores: other "
            f"work shares this CPU, so timings will be noisy (ratios less so{hint})")
    run_dtypes = tuple(dict.fromkeys(c.dtype for c in cases))
    log(f"{preset.name} preset on {info['machine']} ({info['device_name']}): "
        f"{len(cases)} cases, backends {', '.join(names)}"
        + (f", peers {', '.join(peer_run)}" if peer_run else "") + "; measuring ceilings")
    phases.add("set-up", phases.total())  # backends (and the extension's build), provenance
    with stop_on_signals(log) as stop:
        with phases.phase("ceilings"):
            ceilings = ceilings_mod.measure(dev, run_dtypes, preset.ceiling_time_s)
        ceilings_s = phases.seconds["ceilings"]
        meter = EnergyMeter(dev, energy_window_s)
        deadline = None if time_limit_s is None else started_mono + time_limit_s
        budget = None if deadline is None else Budget(deadline, time_limit_s)
        ctx = Context(preset, dev, names, ceilings, seed=seed, meter=meter, log=log,
                      sparse_backends=sparse_requested or None, peers=peer_run,
                      deadline=deadline, budget=budget)
        stop.ctx = ctx
        n_names = len(names) + len(peer_run) + len(sparse_names) + 1  # and the MLP
        expected_rows = sum(len(c.passes) for c in cases) * n_names
        if budget is not None:  # the closing ceilings take what the opening ones took
            budget.closing_s = ceilings_s + budget_mod.reports_s(
                expected_rows, plots and out_dir is not None)

        def meta_of(ceilings: Ceilings) -> dict:
            return {
                "command": command or f"python -m bench --preset {preset.name}",
                "provenance": info,
                "preset": {"name": preset.name, "description": preset.description,
                           "min_time_s": preset.min_time_s, "rounds": preset.rounds,
                           "max_call_s": preset.max_call_s,
                           "dtypes": list(run_dtypes), "passes": sorted({p for c in cases
                                                                         for p in c.passes})},
                "backends": [*names, *peer_run, *map(kept.sparse_label, sparse_names)],
                # what each backend's ratio to the best peer (results.PEER_COLUMN) is over
                "peers": [*(b for b in peers.BACKEND_PEERS if b in names), *peer_run],
                # what speedup_vs_baseline and speedup_best are over
                "baseline": registry.baseline().name,
                "unavailable": unavailable,
                "ceilings": ceilings.as_dict(),
                "memory_method": memory.MEMORY_METHOD[dev.type],
                "energy": meter.describe(),
                "elapsed_s": round(time.perf_counter() - started, 1),
                "phases": phases.seconds,  # the live dict: the reports phase joins it
            }

        writer = None if out_dir is None else RowsWriter(out_dir, ctx, info, meta_of)
        with phases.phase("cases"):
            rows = run_cases(ctx, cases, progress=progress, cost=case_cost,
                             prior_s_per_cost=preset.seconds_per_cost, on_group=writer)
        closing = closing_notes(ctx, ceilings_s, len(rows), plots and out_dir is not None)
        if any(isinstance(r.get("note"), str) and "time limit" in r["note"] for r in rows):
            log(f"the time limit of {time_limit_s:g} s left too little for some shapes or "
                "backends: they are in the results as skipped, each saying why")
        if "ceilings" in closing:
            log(f"the closing ceilings are not measured again: {closing['ceilings']}")
            ceilings = dataclasses.replace(ctx.ceilings, details={
                **ctx.ceilings.details,
                "measured": "the fastest call seen at the start (and briefly between cases on "
                            f"a CPU); not measured again at the end: {closing['ceilings']}"})
        else:
            log("measuring the ceilings again")
            with phases.phase("ceilings"):
                ceilings = ctx.ceilings.best_of(ceilings_mod.measure(dev, run_dtypes,
                                                                     preset.ceiling_time_s))
        if "plots" in closing:
            log(f"no plots: {closing['plots']}")
            plots = False
        info["load_average_end"] = provenance.load_average()
        table = results.table(rows, ceilings, info)
        meta = meta_of(ceilings)
        if time_limit_s is not None or closing:
            meta["time_limit"] = {"limit_s": time_limit_s, **closing}
        output = RunOutput(table, meta)
        if out_dir is not None:
            with phases.phase("reports"):
                output.files.extend(write_reports(table, meta, out_dir, install_dispatch,
                                                  plots))
            meta["elapsed_s"] = round(time.perf_counter() - started, 1)
    if ctx.stopped is not None:
        log(f"stopped by {ctx.stopped}: the reports hold the shapes measured before it")
        raise Stopped(128 + getattr(signal, ctx.stopped))
    return output


def write_reports(table: pd.DataFrame, meta: dict, out_dir: Path, install_dispatch: bool = False,
                  plots: bool = True, kind: str | None = None) -> list[Path]:
    """A run's files in `out_dir`: its dispatch table (for machine kind `kind`, this machine's
    by default; copied into glai_kernels/dispatch/ with `install_dispatch`), results.csv and
    .json, plots/ and summary.md. Records each table's evaluation in meta["dispatch"] (the
    dense op's) and meta["sparse_dispatch"] (the sparse op's, from the kept-fraction sweep)."""
    from bench.harness import dispatch_table
    from bench.reporting import summary

    written: list[Path] = []
    for op, key in dispatch_table.META_KEYS.items():
        built = dispatch_table.build(table, meta, kind, op=op)
        if built is None:  # no case of this op serves auto (the sparse op: no kept sweep)
            continue
        dispatch, evaluation = built
        path = dispatch_table.write(dispatch, out_dir)
        meta[key] = {**evaluation, "file": f"dispatch/{path.name}"}
        written.append(path)
        if install_dispatch:
            installed = dispatch_table.install(path)
            meta[key]["installed"] = str(installed.relative_to(installed.parents[2]))
            written.append(installed)
    # the kept-fraction sweep's step pass gives the layout crossover (glai_kernels/dispatch/)
    from bench.harness import crossover_table
    written.extend(crossover_table.write_for_run(table, meta, out_dir, install_dispatch, kind))
    written.extend(results.write(table, out_dir, meta))
    if plots:
        from bench.reporting import plots as plots_mod

        written.extend(plots_mod.write_all(table, meta, out_dir / "plots"))
    written.append(summary.write(table, meta, out_dir))
    return written
