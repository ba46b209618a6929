"""The lease script's step summaries (bench/tools/lease_summaries.py): the lines on_gpu.sh puts
in bench.log after its energy and triton steps, from a results.csv written here, and the line
saying there is none when a step ended before writing one."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bench.tools import lease_summaries

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

ENERGY_FIELDS = ("head", "batch", "pass", "backend", "median_s", "energy_j", "power_w",
                 "energy_window_s", "note")
TRITON_FIELDS = ("head", "batch", "pass", "backend", "median_s", "first_call_s", "note")


def _csv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_energy_lines_take_each_row_and_mark_missing_values(tmp_path):
    path = _csv(tmp_path / "energy" / "results.csv", ENERGY_FIELDS, [
        {"head": "A1", "batch": "16", "pass": "train", "backend": "cuda", "median_s": "0.0001234",
         "energy_j": "0.031", "power_w": "251.7", "energy_window_s": "1.02", "note": ""},
        {"head": "B1", "batch": "16", "pass": "forward", "backend": "torch", "median_s": "",
         "energy_j": "", "power_w": "", "energy_window_s": "", "note": "skipped: time limit"},
    ])
    lines = lease_summaries.energy_lines(path)
    assert lines == [
        "energy (NVML, windows of >= 1 s): head B pass backend median_us J/call W window_s note",
        "  A1 16 train cuda 123.4 0.031 251.7 1.02 ",
        "  B1 16 forward torch - - - - skipped: time limit",
    ]


def test_a_step_without_results_says_so(tmp_path):
    missing = tmp_path / "energy" / "results.csv"
    assert lease_summaries.energy_lines(missing) == [
        "energy (NVML, windows of >= 1 s): head B pass backend median_us J/call W window_s note"
        f": none, no {missing} (the step ended before writing it)"]
    lines = lease_summaries.triton_lines(tmp_path / "triton")
    assert lines == [
        "triton autotune s, each row's first call (the suite times the calls after it): none, "
        f"no {tmp_path / 'triton' / 'results.csv'} (the step ended before writing it)",
        "triton autotune s, each kernel's tuning per new shape (glai_kernels/triton_tuning.py):"]


def test_triton_lines_give_first_calls_then_the_tuning_records(tmp_path):
    folder = tmp_path / "triton"
    _csv(folder / "results.csv", TRITON_FIELDS, [
        {"head": "A1", "batch": "16", "pass": "both", "backend": "triton", "median_s": "0.0004",
         "first_call_s": "3.217", "note": ""},
        {"head": "A1", "batch": "16", "pass": "both", "backend": "torch", "median_s": "0.0009",
         "first_call_s": "0.5", "note": ""},  # not triton: left out
        {"head": "C2", "batch": "4096", "pass": "forward", "backend": "triton", "median_s": "",
         "first_call_s": "7", "note": "wrong result"},
        {"head": "C2", "batch": "16", "pass": "train", "backend": "triton", "median_s": "0.001",
         "first_call_s": "", "note": ""},  # no first call timed: left out
    ])
    records = folder / "triton-autotune"
    records.mkdir()
    for name, kernel in (("b.json", "grad_weight"), ("a.json", "forward")):
        (records / name).write_text(json.dumps({
            "kernel": kernel, "key": {"B": 16, "I": 384, "P": 256, "O": 37, "precision": "tf32"},
            "tune_s": 2.5, "timings_s": [1e-4, 2e-4, 3e-4], "config": [64, 32, 64, 1, 4]}))
    assert lease_summaries.triton_lines(folder) == [
        "triton autotune s, each row's first call (the suite times the calls after it):",
        "  A1 B=16 both: 3.22 s (then 400.0 us)",
        "  C2 B=4096 forward: 7.00 s (then wrong result)",
        "triton autotune s, each kernel's tuning per new shape (glai_kernels/triton_tuning.py):",
        "  forward B<=16 I=384 P=256 O=37 tf32: 2.5 s, 3 configs timed, chose [64, 32, 64, 1, 4]",
        "  grad_weight B<=16 I=384 P=256 O=37 tf32: 2.5 s, 3 configs timed, chose "
        "[64, 32, 64, 1, 4]",
    ]


def test_main_prints_the_summary_and_refuses_an_unknown_one(tmp_path, capsys):
    missing = tmp_path / "results.csv"
    assert lease_summaries.main(["energy", str(missing)]) == 0
    assert capsys.readouterr().out.endswith(f"no {missing} (the step ended before writing it)\n")
    assert lease_summaries.main(["power", str(missing)]) == 2
    assert "usage" in capsys.readouterr().err


def test_the_lease_script_calls_both_summaries():
    script = (Path(__file__).resolve().parents[1] / "tools" / "on_gpu.sh").read_text()
    assert "-m bench.tools.lease_summaries energy $WORK/bench_cuda/energy/results.csv" in script
    assert "-m bench.tools.lease_summaries triton $WORK/bench_cuda_triton" in script
