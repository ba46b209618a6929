"""Made-up runs, records and result rows that several of the benchmark suite's tests build on:
in one module, so no test file imports another (each names what it takes from here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.harness import results
from bench.reporting import history

# ---- a gate run's results.json (test_gate, test_gate_paired, test_hostile_cli)

HEADS = ("A1", "A2", "B1", "C1")
BACKENDS = ("einsum", "torch", "cpp")


def fake_run(rng: np.random.Generator, noise: float, slow: dict[str, float] | None = None,
             machine: str = "cpu-2core") -> dict:
    """A results.json with every (backend, head, pass) speedup at 2.0 (roofline 40%) times
    log-normal noise of sd `noise`; `slow` divides a backend's ratios by its factor."""
    slow = slow or {}
    rows = []
    for backend in BACKENDS:
        for head in HEADS:
            for pass_ in ("forward", "both"):
                factor = slow.get(backend, 1.0)
                jitter = float(np.exp(rng.normal(0.0, noise)))
                speed = 1.0 if backend == "einsum" else 2.0 * jitter / factor
                rows.append({"backend": backend, "head": head, "batch": 16, "inputs": 100,
                             "paths": 10, "outputs": 4, "dtype": "float32", "pass": pass_,
                             "device": "cpu", "status": "ok", "correct": True,
                             "speedup_best": speed, "median_s": 2e-3, "min_s": 1e-3,
                             # the fastest-sample share is 2x the median's: 40%
                             "roofline_pct": 20.0 * jitter / factor})
    device = "cuda" if machine.startswith("cuda") else "cpu"
    return {"provenance": {"machine": machine, "device": device, "commit": "c0ffee",
                           "cpu_id": "TestCPU family 1 model 1", "load_average": 0.1},
            "preset": {"name": "quick"}, "rows": rows}


# ---- a history record (test_history, test_dashboard, test_hostile_cli)

# the folder and machine of a record made by history_results() on its CPU
HISTORY_KIND = "cpu-2core-TestCPU-family-1-model-1"


def history_results(commit: str = "a" * 40, date: str = "2026-11-22T03:00:00+00:00",
                    machine: str = "cpu-2core", speedup: float = 2.0) -> dict:
    """A small results.json as `python -m bench` writes it (two backends, one case)."""
    case = {"head": "A2", "batch": 16, "inputs": 769, "paths": 64, "outputs": 4,
            "dtype": "float32", "pass": "forward", "device": "cpu", "sweep": "heads",
            "status": "ok", "correct": True}
    return {
        "command": "python -m bench --preset quick", "baseline": "einsum",
        "provenance": {"commit": commit, "date": date, "machine": machine,
                       "device": machine.split("-")[0], "cpu_id": "TestCPU family 1 model 1",
                       "device_name": "AMD EPYC", "load_average": 0.5},
        "preset": {"name": "quick"},
        "ceilings": {"matmul_flops": {"float32": 2e11}},
        "rows": [{**case, "backend": "einsum", "median_s": 2e-3, "speedup_vs_baseline": 1.0,
                  "roofline_pct": 10.0, "winner": False, "extra_column": 1},
                 {**case, "backend": "torch", "median_s": 2e-3 / speedup,
                  "speedup_vs_baseline": speedup, "roofline_pct": 10.0 * speedup,
                  "winner": True}],
    }


def _record_text(**change) -> str:
    raw = history.make_record(history_results(commit="b" * 40))
    raw.update(change)
    return json.dumps({k: v for k, v in raw.items() if v is not None})


def _row_text(change) -> str:
    raw = history.make_record(history_results(commit="b" * 40))
    change(raw["rows"])
    return json.dumps(raw)


# file text -> the reason its warning gives
MALFORMED = {
    "truncated": (_record_text()[:150], "not readable JSON"),
    "empty": ("", "empty file"),
    "not-an-object": ("[1, 2, 3]", "list where a JSON object was expected"),
    "null": ("null", "NoneType where a JSON object was expected"),
    "only-its-kind": (json.dumps({"kind": history.KIND}),
                      "missing or empty required field.*commit, date, machine, preset"),
    "no-machine": (_record_text(machine=None), r"required field\(s\) machine"),
    "empty-date": (_record_text(date=""), r"required field\(s\) date"),
    "no-kind": (_record_text(kind=None), "no kind"),
    "no-rows": (_record_text(rows=None), "rows is NoneType"),
    "rows-not-objects": (_record_text(rows=[1, 2]), r"rows\[0\] is int"),
    "row-without-backend": (_row_text(lambda rows: rows[1].pop("backend")),
                            r"rows\[1\] lacks backend"),
    "bad-schema": (_record_text(schema="two"), "schema 'two' is not a version number"),
    "old-unknown-schema": (_record_text(schema=0), "schema 0 is unknown"),
    "ceilings-not-object": (_record_text(ceilings=[1]), "ceilings is list"),
    # fields of the wrong type, each of which once stopped the whole dashboard
    "batch-a-list": (_row_text(lambda rows: rows[0].update(batch=[16])),
                     r"rows\[0\]\.batch is \[16\], expected an integer"),
    "backend-a-number": (_row_text(lambda rows: rows[1].update(backend=7)),
                         r"rows\[1\]\.backend is 7, expected a string"),
    "median-a-string": (_row_text(lambda rows: rows[0].update(median_s="fast")),
                        r"rows\[0\]\.median_s is 'fast', expected a number"),
    "winner-a-number": (_row_text(lambda rows: rows[0].update(winner=1)),
                        r"rows\[0\]\.winner is 1, expected true or false"),
    "machine-a-number": (_record_text(provenance={"machine": 5, "device": "cpu"}),
                         r"provenance\.machine is 5, expected a string"),
    "not-utf8": (b"\xff\xfe{".decode("latin-1"), "not readable JSON"),
}


def write_malformed(history_dir: Path, case: str) -> Path:
    """One bad file (MALFORMED[case]) among the records of `history_dir`."""
    path = history_dir / HISTORY_KIND / f"20261123T000000Z-{case}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = MALFORMED[case][0]
    path.write_bytes(text.encode("latin-1") if case == "not-utf8" else text.encode())
    return path



# ---- a results row and a run's meta for the dispatch table and merge (test_dispatch_table,
# test_merge, test_hostile_cli)

def table_row(backend: str, batch: int, ms: float, pass_: str = "both", inputs: int = 384,
         status: str = "ok", correct: bool = True) -> dict:
    return {"sweep": "heads", "head": "A1", "backend": backend, "batch": batch,
            "inputs": inputs, "paths": 256, "outputs": 37, "dtype": "float32", "pass": pass_,
            "device": "cpu", "mu": None, "status": status, "correct": correct,
            "median_s": ms / 1e3, "min_s": ms / 1e3, "iqr_s": 0.0}


def run_meta() -> dict:
    return {"provenance": {"device": "cpu", "threads": 2, "commit": "abc", "date": "2026",
                           "machine": "test", "device_name": "cpu"},
            "command": "glai-bench run --preset tiny", "preset": {"name": "tiny"},
            "backends": ["einsum", "torch", "cpp", "peer:einsum"]}



MERGE_KIND = "cuda-Test-GPU-sm90"


def write_run(tmp_path, name, rows, ceilings, kind=MERGE_KIND, machine="test"):
    out = tmp_path / name
    meta = run_meta()
    meta["provenance"].update(machine=machine, torch_version="2.13.0")  # what a run records
    meta["ceilings"] = ceilings.as_dict()
    meta["dispatch"] = {"machine_kind": kind}
    meta["command"] = f"glai-bench run --out {name}"
    meta["preset"] = {"name": "tiny", "description": "two shapes", "min_time_s": 0.01,
                      "rounds": 1, "max_call_s": 0.1, "dtypes": ["float32"], "passes": ["both"]}
    meta.update(baseline="einsum", peers=["torch"], unavailable={}, memory_method="test",
                energy="absent: test", elapsed_s=1.0)
    results.write(results.table(rows, ceilings, {}), out, meta)
    return out


