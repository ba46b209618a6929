"""Measuring for the gate, and its re-measure policy: a run in this process or in a fresh one,
and `check`, which re-measures a failure and judges the best value each ratio reached."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.gate.planted import from_spec
from bench.gate.reporting import report
from bench.gate.stats import best_of, compare, compare_ratios
from bench.gate.store import BASELINE_DIR, ROOT, load_baseline, machine_kind
from bench.reporting.history import write_atomic

# torch CPU threads the gate times with (bench/gate/__init__.py says why)
CPU_THREADS = 1


def measure(preset="quick", *, device: str | None = None, log=print,
            threads: int | None = None, **options) -> dict:
    """One run of `preset` (a name or a `bench.harness.sweeps.Preset`; kernel suite, no plots)
    as the results.json dict it would write; on a CPU with `threads` (default `CPU_THREADS`);
    `options` go to `bench.harness.suite.run` (e.g. backends)."""
    import torch

    from bench.harness import suite
    from bench.harness.provenance import ROW_FIELDS

    if threads is None and suite.resolve_device(device).type == "cpu":
        threads = CPU_THREADS
    name = getattr(preset, "name", preset)
    previous = torch.get_num_threads()
    try:
        out = suite.run(preset, device=device, plots=False, progress=False, log=log,
                        threads=threads, command=f"python -m bench.gate (preset {name})",
                        **options)
    finally:
        torch.set_num_threads(previous)  # the caller's threads, e.g. the rest of a test session
    rows = json.loads(out.table.drop(columns=list(ROW_FIELDS))
                      .to_json(orient="records"))
    return {**out.meta, "rows": rows}


def measure_fresh(preset: str = "quick", *, device: str | None = None,
                  plant: str | None = None) -> dict:
    """One run of `preset` in a fresh Python process (`python -m bench.gate measure`), as CI
    runs it; `plant` ("BACKEND=FACTOR") slows a backend down in that process."""
    with tempfile.TemporaryDirectory(prefix="glai-gate-") as tmp:
        out = Path(tmp) / "results.json"
        command = [sys.executable, "-m", "bench.gate", "measure", "--out", str(out),
                   "--preset", preset]
        if device:
            command += ["--device", device]
        if plant:
            command += ["--plant", plant]
        subprocess.run(command, check=True, cwd=ROOT)
        return json.loads(out.read_text())


def save_run(path: Path, result: dict) -> None:
    """One run's results.json dict, written atomically."""
    write_atomic(path, json.dumps(result, default=str) + "\n")


def check(results: dict | None = None, *, baseline_dir: Path = BASELINE_DIR,
          confirm: int = 2, preset="quick", device: str | None = None,
          save_dir: Path | None = None, log=print, fresh: bool = False,
          plant: str | None = None, **options) -> tuple[bool, str]:
    """Measure (unless `results` is given) and compare; on a failure measure up to `confirm`
    more times and judge the best of all runs. `fresh` runs each measurement in its own
    process (`plant` then slows a backend there); otherwise here, with `options` going to
    `bench.harness.suite.run`. Returns (passed, report)."""
    def measure_once() -> dict:
        if fresh:
            return measure_fresh(getattr(preset, "name", preset), device=device, plant=plant)
        with from_spec(plant):
            return measure(preset, device=device, log=log, **options)

    def run() -> dict:
        result = measure_once()
        if save_dir is not None:
            save_dir.mkdir(parents=True, exist_ok=True)
            path = save_dir / f"gate-run-{len(list(save_dir.glob('gate-run-*.json'))) + 1}.json"
            save_run(path, result)
        return result

    runs = [results if results is not None else run()]
    machine = machine_kind(runs[0]["provenance"])
    baseline = load_baseline(machine, baseline_dir)
    if baseline is None:
        return True, (f"regression gate: no baseline for machine kind {machine!r} in "
                      f"{baseline_dir}; nothing to compare. Make one with "
                      f"`nox -s gate -- accept` and commit it.")
    threads = (baseline.get("threads"), runs[0]["provenance"].get("threads"))
    if None not in threads and threads[0] != threads[1]:
        return False, (f"regression gate: the baseline was timed with {threads[0]} CPU "
                       f"threads, this run with {threads[1]}; ratios at different thread "
                       f"counts are not comparable. Accept a new baseline with this code.")
    verdict = compare(runs[0], baseline)
    for attempt in range(confirm if results is None else 0):
        if verdict.ok:
            break
        log(report(verdict, baseline))
        log(f"re-measuring to confirm ({attempt + 1} of {confirm}): a regression must "
            f"show in every run")
        runs.append(run())
        verdict = compare_ratios(best_of(runs), baseline)
    return verdict.ok, report(verdict, baseline)


