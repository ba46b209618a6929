"""The baseline store: a baseline (`reports/baseline/<machine kind>.json`) built from N runs of
unchanged code, written and read."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from bench.gate.stats import ratios, thresholds_from
from bench.reporting.history import machine_kind, slug, write_atomic

ROOT = Path(__file__).resolve().parents[2]
BASELINE_DIR = ROOT / "reports" / "baseline"
BASELINE_SCHEMA = 1


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
        "kind": "glai-kernels-gate-baseline", "schema": BASELINE_SCHEMA,
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
    """The committed baseline for this kind of machine, None when there is none."""
    path = baseline_path(machine, baseline_dir)
    if not path.exists():
        return None
    baseline = json.loads(path.read_text())
    if baseline.get("schema", 1) > BASELINE_SCHEMA:
        raise ValueError(f"{path}: baseline schema {baseline['schema']} is newer than this "
                         f"code's {BASELINE_SCHEMA}")
    return baseline


def accept(runs: list[dict], *, baseline_dir: Path = BASELINE_DIR,
           **options) -> tuple[Path, dict]:
    """Build a baseline from `runs` (options: see `build_baseline`) and write it."""
    baseline = build_baseline(runs, **options)
    return write_baseline(baseline, baseline_dir), baseline


