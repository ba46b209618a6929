"""Run a preset: every case × backend × pass, timed, checked against the oracle, measured.

For each distinct (shape, dtype) of the preset, in order:
1. skip what cannot run: a pass whose roofline floor exceeds the preset's per-call limit,
   inputs + float64 oracle that do not fit in free memory, a backend whose estimated
   memory does not fit or that does not take the dtype (each a `skipped` row with a note);
2. per pass and backend (`bench.harness.calls`): a first call whose outputs are checked
   against the float64 oracle (`correct`, `error_ratio`), a second call (too slow to time:
   skipped), warm-up calls (which also size the timing blocks), one call under the memory
   meter;
3. time all backends of the pass together (`bench.harness.timing`), then the energy (NVIDIA
   only).
A shape that belongs to several sweeps is measured once and reported under each.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from bench.harness import ceilings as ceilings_mod
from bench.harness import kept, memory, peers
from bench.harness.budget import TIME_LIMIT_NOTE, Budget, lower_bound_s, past, why_not
from bench.harness.calls import Measurement, first_calls, skip, warm_call_s
from bench.harness.ceilings import Ceilings
from bench.harness.energy import EnergyMeter
from bench.harness.oracle import CHUNK_BYTES, Oracle, tf32_enabled
from bench.harness.passes import PASSES, PassSpec, Tensors, dtype_of, make_call, split_available
from bench.harness.sweeps import KEPT_PASSES, Case, Preset, expand
from bench.harness.timing import time_calls
from glai_kernels import registry
from glai_kernels.contract import Shape
from glai_kernels.paper_heads import PAPER_HEADS
from reference import make_inputs

# the share of free memory a case may plan to use
MEMORY_FRACTION = 0.7
ROTATING_SETS_MAX = 8


@dataclass
class Context:
    """What every case of one run shares."""

    preset: Preset
    device: torch.device
    backends: list[str]
    ceilings: Ceilings
    seed: int = 0
    meter: EnergyMeter | None = None
    log: Callable[[str], None] = print
    memory_fraction: float = MEMORY_FRACTION
    notes: list[str] = field(default_factory=list)
    # the kept-fraction sweep (bench/harness/kept.py): sparse backends to run (None: every available
    # one) and the inputs of the (head, batch) being measured, shared across its μ
    sparse_backends: list[str] | None = None
    kept_inputs: object = None
    # bench-only peers (bench/harness/peers.py) timed beside the backends, where their sweeps ask
    peers: list[str] = field(default_factory=list)
    # time.monotonic() after which no further shape is measured (a short lease of a GPU):
    # the rest are written as skipped, so the run still ends with its reports
    deadline: float | None = None
    # the run's time limit with its closing reserve (bench/harness/budget.py): a shape or a
    # backend is not started when its estimate does not fit what is left
    budget: Budget | None = None
    # the signal that asked the run to stop ("SIGTERM", "SIGINT"; None: none): nothing more is
    # started, and the run closes with its reports (bench/harness/suite.py)
    stopped: str | None = None

    def measurement_bound_s(self) -> float:
        """The fewest seconds one backend's measurement of one pass takes in this run."""
        window = self.meter.window_s if self.meter is not None and self.meter.available else 0
        return lower_bound_s(self.device.type, self.preset.min_time_s, self.preset.rounds,
                             window)


def select_backends(requested: Sequence[str] | None, device: torch.device,
                    log: Callable[[str], None] = print) -> tuple[list[str], dict[str, str]]:
    """(backends to run, {unavailable backend: reason}), the baseline first.

    Unknown names raise ValueError listing the registered ones. The registry's baseline
    backend (`registry.baseline()`) joins every run: speedups are measured against it in the
    same run.
    """
    names = list(requested) if requested else registry.names()
    for name in names:
        registry.get(name)
    baseline = registry.baseline().name
    if baseline not in names:
        log(f"adding the {baseline!r} backend: speedups are measured against it")
        names.insert(0, baseline)
    names.sort(key=lambda n: n != baseline)
    run, unavailable = split_available(
        names, lambda name: registry.get(name).unsupported_reason(device.type))
    for name, reason in unavailable.items():
        log(f"backend {name!r} is unavailable on {device.type}: {reason}")
    return run, unavailable


def make_sets(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int,
              count: int = 1) -> list[Tensors]:
    """`count` independent seeded input sets (with dy) for one shape."""
    sets = []
    for k in range(count):
        x, act, weight, _ = make_inputs(shape.batch, shape.inputs, shape.paths, shape.outputs,
                                        dtype=dtype, device=device, seed=seed + k, bias=False)
        gen = torch.Generator().manual_seed(10_000 + seed + k)
        dy = torch.randn(shape.batch, shape.outputs, generator=gen, dtype=torch.float64)
        sets.append(Tensors(x, act, weight, dy.to(device=device, dtype=dtype)))
    return sets


def rotating_count(shape: Shape, itemsize: int, device: torch.device, budget: int) -> int:
    """Input sets to rotate through on a GPU: enough to exceed twice the L2 cache."""
    if device.type != "cuda":
        return 1
    per_set = shape.min_bytes(itemsize, "backward")
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 2**25
    wanted = math.ceil(2 * l2 / max(per_set, 1))
    fits = max(1, budget // (4 * max(per_set, 1)))
    return max(1, min(ROTATING_SETS_MAX, wanted, fits))


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _unsupported(name: str, device: torch.device, dtype: torch.dtype) -> str | None:
    if peers.is_peer(name):
        return None  # select() kept only available peers; every one takes every dtype
    return registry.get(name).unsupported_reason(device.type, dtype)


def _estimate_bytes(name: str, shape: Shape, spec: PassSpec, itemsize: int) -> int:
    if peers.is_peer(name):
        return peers.estimate_bytes(shape, spec, itemsize)
    return memory.estimate_bytes(name, shape, spec, itemsize)


def measure_shape(ctx: Context, shape: Shape, dtype_name: str, passes: Sequence[str],
                  sweeps: Sequence[str] = ()) -> dict[tuple[str, str], Measurement]:
    """{(pass, backend or peer): measurement} for one shape and dtype, measured for
    `sweeps` (which decide the peers that join)."""
    dtype, device, preset = dtype_of(dtype_name), ctx.device, ctx.preset
    itemsize = torch.empty(0, dtype=dtype).element_size()
    out: dict[tuple[str, str], Measurement] = {}
    names = [*ctx.backends, *peers.for_sweeps(ctx.peers, sweeps)]

    def skip_all(pass_: str, note: str) -> None:
        for b in names:
            out[(pass_, b)] = skip(note)

    budget = int(memory.available_bytes(device) * ctx.memory_fraction)
    oracle_need = memory.oracle_bytes(shape, CHUNK_BYTES)
    if oracle_need > budget:
        for p in passes:
            skip_all(p, f"inputs and the float64 oracle need {_gib(oracle_need)}, "
                        f"more than {_gib(budget)} free")
        return out
    runnable = []
    for p in passes:
        spec = PASSES[p]
        floor = ctx.ceilings.floor_s(spec.flops(shape), spec.min_bytes(shape, itemsize),
                                     dtype_name)
        if floor > preset.max_call_s:
            skip_all(p, f"roofline floor {floor:.2g} s per call exceeds the "
                        f"{preset.name} preset's limit of {preset.max_call_s} s")
        else:
            runnable.append(p)
    if not runnable:
        return out

    sets = make_sets(shape, dtype, device, ctx.seed,
                     rotating_count(shape, itemsize, device, budget - oracle_need))
    oracle = Oracle(sets[0])
    tf32 = dtype == torch.float32 and tf32_enabled(device)

    for p in runnable:
        spec = PASSES[p]
        ready: dict[str, Callable[[], object]] = {}
        warm_s: dict[str, float] = {}
        for b in names:
            reason = _unsupported(b, device, dtype)
            if reason is not None:
                out[(p, b)] = skip(f"{b}: {reason}")
                continue
            # checked before each backend: one first call may autotune for tens of seconds
            late = why_not(ctx, ctx.measurement_bound_s())
            if late is not None:
                out[(p, b)] = skip(late)
                continue
            need = _estimate_bytes(b, shape, spec, itemsize) * len(sets)
            if need > budget - oracle_need:
                out[(p, b)] = skip(f"needs about {_gib(need)}, more than "
                                   f"{_gib(budget - oracle_need)} free")
                continue
            out[(p, b)] = m = {"est_mem_bytes": need}
            started = time.perf_counter()
            try:
                prepared = _prepare(ctx, b, spec, sets, oracle, tf32, m)
            except Exception as e:  # a backend failing one case must not end the run
                m.update(status="error", note=f"{type(e).__name__}: {e}".splitlines()[0])
                ctx.log(f"{b} {p} {shape} {dtype_name} failed:\n{traceback.format_exc()}")
                prepared = None
            m["measure_s"] = time.perf_counter() - started
            if prepared is not None:
                ready[b], warm_s[b] = prepared

        timings = time_calls(ready, warm_s, device, preset.min_time_s, preset.rounds)
        for b, timing in timings.items():
            m = out[(p, b)]
            m.update(status="ok" if m["correct"] else "wrong", **timing.fields())
            m["measure_s"] += timing.total_s
            if not m["correct"]:
                m["note"] = f"differs from the float64 oracle ({m['error_ratio']:.3g}x tolerance)"
            if ctx.meter is not None and ctx.meter.available:
                try:
                    energy = ctx.meter.measure(ready[b], timing.median_s)
                except Exception as e:  # NVML can fail mid-run; the timing still stands
                    m["note"] = f"energy not measured: {type(e).__name__}: {e}"
                else:
                    m.update(energy_j=energy.joules_per_call, power_w=energy.watts,
                             energy_window_s=energy.window_s)
    return out


def _prepare(ctx: Context, backend: str, spec: PassSpec, sets: list[Tensors], oracle: Oracle,
             tf32: bool, m: Measurement) -> tuple[Callable[[], object], float] | None:
    """Check, warm up and measure the memory of one backend's call; (fn, median warm call
    time) to time, or None when it is too slow to time (m then says so)."""
    device, preset = ctx.device, ctx.preset
    make = peers.make_call if peers.is_peer(backend) else make_call
    call = make(backend, spec, sets)
    check = call if len(sets) == 1 else make(backend, spec, sets[:1])
    fn = call.timed
    calls = first_calls(check, fn, device, preset, m)
    if calls is None:
        return None
    first, second = calls
    m["error_ratio"] = oracle.error_ratio(first, tf32)
    m["correct"] = m["error_ratio"] <= 1.0
    del first
    warm = warm_call_s(fn, device, second)
    m["peak_mem_bytes"] = memory.peak_bytes(fn, device)
    return fn, warm


def shape_groups(cases: Sequence[Case], cost: Callable[[Case], float] | None = None
                 ) -> tuple[dict, dict, dict]:
    """The cases grouped as the progress bar's items, one a (shape, dtype, μ): (the groups'
    cases, each group's passes, each group's cost: `cost` of a Case with all its passes,
    1.0 each when None)."""
    groups: dict[tuple[Shape, str, float | None], list[Case]] = {}
    for case in cases:
        groups.setdefault((case.shape, case.dtype, case.mu), []).append(case)
    passes_of = {key: tuple(dict.fromkeys(p for c in members for p in c.passes))
                 for key, members in groups.items()}
    costs = {key: 1.0 if cost is None else cost(dataclasses.replace(members[0],
                                                                    passes=passes_of[key]))
             for key, members in groups.items()}
    return groups, passes_of, costs


def run_cases(ctx: Context, cases: list[Case], progress: bool = True,
              cost: Callable[[Case], float] | None = None,
              prior_s_per_cost: float | None = None,
              on_group: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Rows (one per case × pass × backend) of raw measurements, in the cases' order. The
    progress bar's estimate of the time left weighs each shape by `cost` (a Case with all
    the passes its shape is measured for; None: every shape alike), `prior_s_per_cost`
    seconds a unit of it before the first shape ends (bench/harness/progress.py). A shape
    is not started when `why_not` refuses its estimate (ctx.budget's rate per unit of cost,
    at least the timers' bound for each of its measurements); its rows say why.
    `on_group(rows so far)` is called after each shape (the suite writes them as it goes)."""
    from bench.harness.progress import EtaBar

    groups, passes_of, costs = shape_groups(cases, cost)
    rows = []
    with EtaBar(costs, desc="bench", unit="shape", disable=not progress,
                prior_s_per_cost=prior_s_per_cost) as bar:
        for key, members in groups.items():
            shape, dtype_name, mu = key
            bar.start(key, f"{members[0].head} B={shape.batch} I={shape.inputs} "
                           f"P={shape.paths} O={shape.outputs} {dtype_name}"
                           + ("" if mu is None else f" mu={100 * mu:.3g}%"))
            passes = list(passes_of[key])
            bound = (len(passes) * len(_labels(ctx, members))
                     * ctx.measurement_bound_s())
            estimate = (bound if ctx.budget is None
                        else ctx.budget.estimate_s(costs[key], bound))
            started = time.perf_counter()
            note = why_not(ctx, estimate)
            group = _run_group(ctx, members, passes, note)
            rows += group
            # the rate is learned from shapes measured (one skipped whole, for its memory or
            # its roofline floor, took no time and would make the estimates optimistic)
            if ctx.budget is not None and any(r.get("status") != "skipped" for r in group):
                ctx.budget.observe(time.perf_counter() - started, costs[key])
            bar.finish(key)
            if on_group is not None:
                on_group(rows)
    return rows


def _labels(ctx: Context, members: list[Case]) -> list[str]:
    """The backends (and peers) a (shape, dtype, μ) is measured with."""
    if members[0].mu is not None:
        return kept.labels(ctx, dtype_of(members[0].dtype))
    return [*ctx.backends, *peers.for_sweeps(ctx.peers, [c.sweep for c in members])]


def _run_group(ctx: Context, members: list[Case], passes: list[str],
               note: str | None = None) -> list[dict]:
    """The rows of one (shape, dtype, μ) measured once for every case that holds it; with
    `note` (or past the run's deadline) not measured, each row skipped with that note."""
    shape, dtype_name, mu = members[0].shape, members[0].dtype, members[0].mu
    late = note is not None or past(ctx.deadline)
    if late:
        measured = {(p, b): skip(note or TIME_LIMIT_NOTE)
                    for p in passes for b in _labels(ctx, members)}
    elif mu is None:
        measured = measure_shape(ctx, shape, dtype_name, passes,
                                 list(dict.fromkeys(c.sweep for c in members)))
    else:  # a kept-fraction case: its own backends (sparse, dense, the MLP)
        measured = kept.measure(ctx, members[0].head, shape, dtype_name, mu, passes)
    rows = []
    for case in members:
        for (p, b), m in measured.items():
            if p in case.passes:
                rows.append({"sweep": case.sweep, "head": case.head, "backend": b,
                             **shape.as_dict(), "dtype": dtype_name, "pass": p,
                             "device": ctx.device.type, "mu": mu, **m})
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    elif not late:  # a shape not measured for the time limit leaves its time to the closing
        ctx.ceilings = ceilings_mod.refresh(ctx.ceilings, ctx.device)
    return rows


def cases_for(preset: Preset, dtypes: Sequence[str] | None = None,
              passes: Sequence[str] | None = None, heads: Sequence[str] | None = None,
              batches: Sequence[int] | None = None,
              sweeps: Sequence[str] | None = None) -> list[Case]:
    """The preset's cases, with dtypes/passes overridden and only the heads/batches/sweeps
    given kept, in the order of `heads` where given (a lease names the heads it has not
    measured yet first; within a head the preset's order); unknown names raise ValueError
    listing the known ones."""
    known_sweeps = list(dict.fromkeys(s.name for s in preset.sweeps))
    for name in sweeps or ():
        if name not in known_sweeps:
            raise ValueError(f"unknown sweep {name!r}; the {preset.name} preset has: "
                             f"{', '.join(known_sweeps)}")
    for name in dtypes or ():
        dtype_of(name)
    known_passes = list(dict.fromkeys([*PASSES, *KEPT_PASSES]))
    for name in passes or ():
        if name not in known_passes:
            raise ValueError(f"unknown pass {name!r}; known: {', '.join(known_passes)}")
    for name in heads or ():
        if name not in PAPER_HEADS:
            raise ValueError(f"unknown head {name!r}; known: {', '.join(PAPER_HEADS)}")
    cases = expand(preset, tuple(dtypes) if dtypes else None, tuple(passes) if passes else None)
    cases = [c for c in cases if (not heads or c.head in heads)
             and (not batches or c.shape.batch in batches)
             and (not sweeps or c.sweep in sweeps)]
    if not cases:
        raise ValueError("no case of the preset matches the --heads/--batches/--sweeps/"
                         "--dtypes asked for")
    if heads:  # a stable sort: within one head the preset's order stays
        rank = {head: i for i, head in enumerate(heads)}
        cases.sort(key=lambda c: rank[c.head])
    return cases
