"""The baseline store: a baseline (`reports/baseline/<machine kind>.json`) built from N runs of
unchanged code, written and read."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path

from bench.gate.stats import GROUP_KEY, RATIO_KEY, ratios, thresholds_from
from bench.reporting.history import machine_kind, read_json_object, slug, write_atomic

ROOT = Path(__file__).resolve().parents[2]
BASELINE_DIR = ROOT / "reports" / "baseline"
BASELINE_SCHEMA = 1
BASELINE_KIND = "glai-kernels-gate-baseline"


def build_baseline(runs: list[dict], *, margin: float = 1.5, case_floor: float = 0.10,
                   group_floor: float = 0.05, note: str = "") -> dict:
    """A baseline (JSON-ready) from N results.json dicts of unchanged code on one machine."""
    if len(runs) < 3:
        raise ValueError(f"runs: a baseline needs at least 3 runs to measure their spread, "
                         f"got {len(runs)}")
    machines = {machine_kind(r["provenance"]) for r in runs}
    if len(machines) != 1:
        raise ValueError(f"runs: all runs must come from one machine kind, got {machines}")
    threads = {r["provenance"].get("threads") for r in runs}
    if len(threads) != 1:
        raise ValueError(f"runs: all runs must use one thread count, got {threads}")
    prov = runs[-1]["provenance"]
    return {
        "kind": BASELINE_KIND, "schema": BASELINE_SCHEMA,
        "machine": machine_kind(prov), "device_name": prov.get("device_name", ""),
        "cpu_id": prov.get("cpu_id", ""), "threads": prov.get("threads"),
        "preset": runs[-1].get("preset", {}).get("name", "custom"),
        "commits": sorted({r["provenance"].get("commit", "unknown") for r in runs}),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_averages": [r["provenance"].get("load_average") for r in runs],
        "n_runs": len(runs), "margin": margin, "case_floor": case_floor,
        "group_floor": group_floor, "note": note,
        **thresholds_from([ratios(r) for r in runs], margin=margin, case_floor=case_floor,
                          group_floor=group_floor),
    }


def baseline_path(machine: str, baseline_dir: Path = BASELINE_DIR) -> Path:
    return baseline_dir / f"{slug(machine)}.json"


def write_baseline(baseline: dict, baseline_dir: Path = BASELINE_DIR) -> Path:
    path = baseline_path(baseline["machine"], baseline_dir)
    write_atomic(path, json.dumps(baseline, indent=1) + "\n")
    return path


def load_baseline(machine: str, baseline_dir: Path = BASELINE_DIR) -> dict | None:
    """The committed baseline for this kind of machine, None when there is none; ValueError
    naming the file when it is not a baseline this code can read (`check_baseline`)."""
    path = baseline_path(machine, baseline_dir)
    if not path.exists():
        return None
    return _read_checked(path, "baseline", check_baseline, "gate baseline")


def read_results(path: Path) -> dict:
    """A results.json dict (as `glai-bench run` or `gate measure` writes it) read from `path`
    for the gate; ValueError naming the file when it lacks what the gate reads."""
    return _read_checked(path, "results file", check_results, "results.json")


def _read_checked(path: Path, what: str, check: Callable[[dict], None], usable: str) -> dict:
    """The JSON object in `path` once `check` passes it; ValueError naming the file: not
    JSON or not an object (`read_json_object`), or "not a usable <usable>" and why."""
    raw = read_json_object(path, what)
    try:
        check(raw)
    except ValueError as e:
        raise ValueError(f"{path}: not a usable {usable}: {e}") from None
    return raw


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_items(items: object, name: str, keys: tuple[str, ...],
                 numbers: tuple[str, ...]) -> None:
    """`items` is a list of objects, each with `keys` and numeric `numbers`."""
    if not isinstance(items, list):
        raise ValueError(f"{name} is {type(items).__name__}, expected a list")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"{name}[{i}] is {type(item).__name__}, expected an object")
        lacking = [k for k in keys if k not in item]
        if lacking:
            raise ValueError(f"{name}[{i}] lacks {', '.join(lacking)}")
        for k in numbers:
            if not _is_number(item[k]):
                raise ValueError(f"{name}[{i}].{k} is {item[k]!r}, expected a number")


def check_baseline(baseline: dict) -> None:
    """Raise ValueError saying what `baseline` lacks of what `check` and its report read."""
    if baseline.get("kind", BASELINE_KIND) != BASELINE_KIND:
        raise ValueError(f"kind {baseline['kind']!r}, expected {BASELINE_KIND!r}")
    schema = baseline.get("schema", 1)
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise ValueError(f"schema {schema!r} is not a version number")
    if schema > BASELINE_SCHEMA:
        raise ValueError(f"baseline schema {schema} is newer than this code's {BASELINE_SCHEMA}")
    if not isinstance(baseline.get("machine"), str):
        raise ValueError(f"machine is {baseline.get('machine')!r}, expected a string")
    for k in ("n_runs", "margin", "case_floor", "group_floor"):
        if not _is_number(baseline.get(k)):
            raise ValueError(f"{k} is {baseline.get(k)!r}, expected a number")
    if not isinstance(baseline.get("spread"), dict):
        raise ValueError("spread is missing or not an object")
    _check_items(baseline.get("entries"), "entries", (*RATIO_KEY, "metric", "median",
                                                      "spread", "threshold"),
                 ("median", "spread", "threshold"))
    _check_items(baseline.get("groups"), "groups", (*GROUP_KEY, "metric", "spread",
                                                    "threshold"), ("spread", "threshold"))


# what the gate reads of each results row (`stats.ratios`)
RESULT_ROW_FIELDS: tuple[str, ...] = (*RATIO_KEY, "status", "correct", "speedup_best",
                                      "roofline_pct", "median_s", "min_s")


def check_results(results: dict) -> None:
    """Raise ValueError saying what `results` (a results.json dict) lacks of what the gate
    reads: the provenance's machine and each row's key, status and ratios."""
    prov = results.get("provenance")
    if not isinstance(prov, dict) or not isinstance(prov.get("machine"), str):
        raise ValueError("provenance.machine is missing or not a string")
    rows = results.get("rows")
    _check_items(rows, "rows", RESULT_ROW_FIELDS, ())
    for i, row in enumerate(rows):
        for k in ("speedup_best", "roofline_pct", "median_s", "min_s"):
            if row[k] is not None and not _is_number(row[k]):
                raise ValueError(f"rows[{i}].{k} is {row[k]!r}, expected a number or null")


def accept(runs: list[dict], *, baseline_dir: Path = BASELINE_DIR,
           **options) -> tuple[Path, dict]:
    """Build a baseline from `runs` (options: see `build_baseline`) and write it."""
    baseline = build_baseline(runs, **options)
    return write_baseline(baseline, baseline_dir), baseline


