"""Every step of a GPU lease ends by itself with its report (bench/tools/on_gpu.sh): the kernel
suite keeps its --time-limit with its closing work (bench/harness/budget.py), writes its rows
as it goes and on SIGTERM; the pipeline keeps a whole-run limit; the lease script's dry run
with tight shares needs no `timeout`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.harness import budget, runner, suite
from bench.harness.budget import Budget
from bench.harness.ceilings import Ceilings
from bench.harness.sweeps import Preset, Sweep
from bench.pipeline import runner as pipeline_runner
from glai_kernels import extension_build

ROOT = Path(__file__).resolve().parents[2]
# A2 (I=769, P=64, O=4) at three small batches: three shapes of a second or so each
THREE = Preset(name="three", description="test preset",
               sweeps=(Sweep("heads", ("A2",), "batch", (2, 3, 5)),),
               dtypes=("float32",), passes=("forward",), min_time_s=0.02, rounds=2,
               max_call_s=1.0, ceiling_time_s=0.02)
FAST = ["einsum", "torch"]
DRY_RUN_VAR = "GLAI_LEASE_DRY_RUN"


def _rows(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "results.csv")


# ---------------------------------------------------------------- the budget's arithmetic

def test_a_measurements_bound_counts_its_energy_window():
    plain = budget.lower_bound_s("cuda", 0.05, 3)
    assert plain >= 0.05
    assert budget.lower_bound_s("cuda", 0.05, 3, energy_window_s=1.0) >= plain + 1.0
    # the CPU's blocks are at least MIN_BLOCK_S each, however small min_time_s
    assert budget.lower_bound_s("cpu", 1e-6, 4) >= 4 * 0.02


def test_estimates_follow_the_rate_seen_and_refusals_say_why():
    b = Budget(time.monotonic() + 100, 100, closing_s=30)
    assert b.estimate_s(cost=10, bound_s=0.5) == 0.5  # nothing seen yet: the bound
    b.observe(seconds=4.0, cost=2)
    assert b.estimate_s(cost=10, bound_s=0.5) == pytest.approx(20.0)
    assert b.refuses(60) is None
    note = b.refuses(80)  # 100 s left, 30 s kept back
    assert note is not None and "time limit of 100 s" in note and "80 s estimated" in note \
        and "30 s for the closing" in note


def _ctx_with(left_s: float, closing_s: float = 0.0) -> runner.Context:
    ctx = runner.Context(THREE, torch.device("cpu"), FAST, Ceilings({"float32": 1e10}, 1e10),
                         log=lambda _: None)
    ctx.budget = Budget(time.monotonic() + left_s, 60, closing_s=closing_s)
    return ctx


def test_the_close_skips_what_does_not_fit_and_says_why():
    assert suite.closing_notes(_ctx_with(1000), ceilings_s=5, rows=10, plots=True) == {}
    # room for the reports with plots but not for the ceilings before them
    reports = budget.reports_s(10, plots=True)
    notes = suite.closing_notes(_ctx_with(reports + 2), ceilings_s=5, rows=10, plots=True)
    assert set(notes) == {"ceilings"} and "5 s they took at the start" in notes["ceilings"]
    # not even the plots
    notes = suite.closing_notes(_ctx_with(1), ceilings_s=5, rows=10, plots=True)
    assert set(notes) == {"ceilings", "plots"}
    stopped = _ctx_with(1000)
    stopped.stopped = "SIGTERM"
    assert suite.closing_notes(stopped, 5, 10, True)["stopped_by"] == "SIGTERM"


# ---------------------------------------------------------------- the kernel suite

def test_shapes_are_estimated_from_the_rate_seen_and_the_ones_that_cannot_fit_are_skipped():
    """After the first shape, the next ones' estimates scale with their cost: a shape a
    million times the first's does not start, however much of the limit is left."""
    ctx = _ctx_with(left_s=600)
    cases = runner.cases_for(THREE)

    def cost(case) -> float:
        return 1.0 if case.shape.batch == 2 else 1e6

    rows = runner.run_cases(ctx, cases, progress=False, cost=cost)
    first = [r for r in rows if r["batch"] == 2]
    rest = [r for r in rows if r["batch"] != 2]
    assert {r["status"] for r in first} == {"ok"} and len(rest) == 2 * len(FAST)
    assert all(r["status"] == "skipped" and "estimated for it" in r["note"] for r in rest)
    assert ctx.budget.spent_cost == 1.0  # skipped shapes teach the rate nothing


def test_a_limit_shorter_than_a_shapes_estimate_ends_in_time_with_every_row_saying_why(
        tmp_path):
    """min_time_s of 30 s makes each measurement's bound longer than the whole limit (two
    backends a shape: 60 s): no shape starts, and the run ends before its limit with its
    reports."""
    slow = Preset(**{**THREE.__dict__, "name": "slow-timing", "min_time_s": 30.0})
    limit = 20.0
    began = time.monotonic()
    output = suite.run(slow, device="cpu", backends=FAST, out_dir=tmp_path, plots=False,
                       progress=False, time_limit_s=limit, log=lambda _: None)
    assert time.monotonic() - began < limit
    rows = _rows(tmp_path)
    assert len(rows) == 3 * len(FAST)  # a row per shape and backend
    assert set(rows["status"]) == {"skipped"}
    assert all(re.search(r"time limit of 20 s left \d+ s, less than the 60 s estimated", n)
               for n in rows["note"])
    assert (tmp_path / "summary.md").exists()
    assert output.meta["time_limit"]["limit_s"] == limit


def test_a_run_stopped_by_sigterm_writes_the_shapes_it_measured(tmp_path, monkeypatch):
    """The first shape measured, SIGTERM arrives (a lease's `timeout`): the rest are skipped
    saying so, the reports are written, and the run exits as the signal would have."""
    measure = runner.measure_shape

    def then_sigterm(*args, **kwargs):
        out = measure(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(runner, "measure_shape", then_sigterm)
    with pytest.raises(suite.Stopped) as stopped:
        suite.run(THREE, device="cpu", backends=FAST, out_dir=tmp_path, plots=False,
                  progress=False, log=lambda _: None)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back
    rows = _rows(tmp_path)
    assert list(rows[rows["batch"] == 2]["status"]) == ["ok"] * len(FAST)
    later = rows[rows["batch"] != 2]
    assert len(later) == 2 * len(FAST)
    assert set(later["note"]) == {"not measured: the run was stopped by SIGTERM"}
    meta = json.loads((tmp_path / "results.json").read_text())
    assert meta["time_limit"]["stopped_by"] == "SIGTERM"
    assert "not measured again at the end" in meta["ceilings"]["details"]["measured"]
    assert (tmp_path / "summary.md").exists()


class _Killed(BaseException):
    """What SIGKILL does to a run, for a test: nothing after it runs."""


def test_a_run_killed_mid_way_leaves_the_rows_it_measured(tmp_path, monkeypatch):
    measure, calls = runner.measure_shape, []

    def dies_on_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise _Killed
        return measure(*args, **kwargs)

    monkeypatch.setattr(runner, "measure_shape", dies_on_the_third)
    with pytest.raises(_Killed):
        suite.run(THREE, device="cpu", backends=FAST, out_dir=tmp_path, plots=False,
                  progress=False, log=lambda _: None)
    rows = _rows(tmp_path)
    # the first shape's rows at least (writing waits for twenty times its own cost)
    assert set(rows["status"]) == {"ok"} and 2 in set(rows["batch"])
    meta = json.loads((tmp_path / "results.json").read_text())
    assert meta["partial"].startswith("written while running")
    assert not (tmp_path / "summary.md").exists()


# ---------------------------------------------------------------- the pipeline

def test_a_unit_is_started_only_when_it_can_finish():
    clock = pipeline_runner.RunClock(time.monotonic() + 60, 60, report_s=5)
    assert clock.starts(50) and not clock.starts(56)
    clock.longest_unit_s = 20  # a unit has ended: half as long again as the longest
    assert clock.starts(100) and not pipeline_runner.RunClock(
        time.monotonic() + 30, 30, report_s=5, longest_unit_s=20).starts(100)
    clock.wrote(4.0)
    assert clock.report_s == 8.0


def test_the_pipeline_with_a_tiny_limit_ends_with_a_report_naming_the_units_not_run(tmp_path):
    began = time.monotonic()
    records = pipeline_runner.run_preset("quick", tmp_path, seeds=1, device="cpu", jobs=1,
                                         progress=False, unit_time_limit_s=30,
                                         time_limit_s=10)
    assert records == [] and time.monotonic() - began < 10
    meta = json.loads((tmp_path / "results.json").read_text())["meta"]
    assert meta["time_limit_s"] == 10
    assert sorted(meta["units"]["not_run"]) == sorted(meta["units"]["planned"])
    assert meta["units"]["done"] == []
    readme = (tmp_path / "README.md").read_text()
    assert "not run, the run's time limit of 10 s" in readme
    assert all(unit in readme for unit in meta["units"]["planned"])


# ---------------------------------------------------------------- the lease script

@pytest.mark.skipif(os.environ.get(DRY_RUN_VAR) != "1",
                    reason=f"about 2 minutes: set {DRY_RUN_VAR}=1 to run it (.ci/run's dry run of "
                           "the script checks that no step needed its timeout)")
def test_the_lease_scripts_dry_run_with_tight_shares_needs_no_timeout(tmp_path):
    """Each step's share is shorter than its whole work: the kernel sweep and the pipeline
    end by themselves with their reports, and a share under a step's floor is skipped with a
    line saying so; no step is killed by its backstop (rc=124)."""
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "PY": sys.executable,
           "GLAI_KERNELS_CACHE": str(extension_build.cache_root()),
           "TOTAL_S": "115", "BUILD_S": "90", "TEST_S": "0", "BENCH_MIN_S": "0",
           "BENCH_DEVICE": "cpu", "BENCH_PRESET": "quick", "BENCH_BACKENDS": "einsum,torch",
           "BENCH_DTYPES": "float32", "TC_S": "20", "TC_PRESET": "quick", "TC_HEADS": "A1",
           "PIPE_S": "25", "PIPE_UNIT_S": "10", "BACKSTOP_S": "8", "BENCH_FLOOR_S": "30"}
    # the bench step gets what the later shares leave (115 s less the build's 10-20, 10, 25
    # and 20: about 40 s), less than the quick preset's six heads need on two cores; the
    # tensor-core share is under its floor (30 s); the pipeline gets the rest, less than its
    # six units need
    began = time.monotonic()
    run = subprocess.run(["bash", "bench/tools/on_gpu.sh"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    steps = (out / "steps.txt").read_text()
    assert "rc=124" not in steps and "rc=137" not in steps, steps + run.stdout[-3000:]
    assert "bench rc=0" in steps and "pipeline rc=0" in steps, steps
    assert "tensor cores: skipped, 20 s left for it" in steps, steps
    assert time.monotonic() - began < 115 + 10
    bench = pd.read_csv(work / "bench_cuda" / "results.csv")
    assert (bench["status"] == "ok").any()
    assert bench["note"].fillna("").str.contains("time limit").any(), \
        "the bench share was meant to be too short for every shape"
    assert (work / "pipeline" / "README.md").exists()
    assert "no summary (step skipped/killed)" not in run.stdout
