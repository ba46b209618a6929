"""The first run (issue 41, item 3): `nox -s bench`'s preset, the estimate of the time left on
every progress bar (bench/harness/progress.py), and the phase times and total the job prints
(bench/__main__.py, noxfile.py). Cheap: the one kernel run is a one-shape tiny preset."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
import time
import types
from pathlib import Path

import pytest

from bench import __main__ as cli
from bench.harness import peers
from bench.harness.passes import PASSES
from bench.harness.progress import EtaBar, Phases, format_duration, format_eta, time_left
from bench.harness.sweeps import (
    ALIASES,
    ALL_PEERS,
    DEFAULT_PRESET,
    FIRST_RUN_MUS,
    KEPT_PASSES,
    PAPER_BATCHES,
    PRESETS,
    Preset,
    Sweep,
    expand,
    matched_mu,
)
from bench.pipeline import presets as pipeline_presets
from bench.pipeline import runner as pipeline_runner
from glai_kernels import dispatch
from glai_kernels.glai import paper_training
from glai_kernels.paper_heads import PAPER_HEADS

ROOT = Path(__file__).resolve().parents[2]
FIRST = PRESETS["first-run"]


# ---------------------------------------------------------------- the first-run preset

def test_first_run_is_the_default_of_the_command_and_of_nox():
    assert DEFAULT_PRESET == "first-run"
    assert cli.parser().parse_args([]).preset == "first-run"
    # and `nox -s bench` passes no --preset (test_nox_bench_...): the command's default is
    # the job's


def test_first_run_times_the_six_heads_at_the_paper_batch_with_every_peer():
    heads = [c for c in expand(FIRST) if c.mu is None]
    assert {c.sweep for c in heads} == {"heads"}
    want = {(h, paper_training(spec).batch_size) for h, spec in PAPER_HEADS.items()}
    assert ("C2", 32) in want and ("A1", 16) in want
    assert {(c.head, c.shape.batch) for c in heads} == want
    assert all(c.shape == PAPER_HEADS[c.head].shape(c.shape.batch) for c in heads)
    assert {c.dtype for c in heads} == {"float32"}
    # the passes auto dispatches on (its modes), so the run's dispatch table covers them all
    assert all(c.passes == dispatch.MODES for c in heads)
    assert set(dispatch.MODES) <= set(PASSES)
    # every backend: the preset names none (the registry's all run), and every peer joins
    # the heads sweep
    assert not hasattr(FIRST, "backends")
    assert FIRST.peers == ALL_PEERS
    assert peers.for_sweeps([peers.get(p).name for p in FIRST.peers], ["heads"]) == [
        peers.get(p).name for p in ALL_PEERS]


def test_first_run_keeps_each_heads_matched_mu_and_brackets_the_crossover():
    kept = [c for c in expand(FIRST) if c.mu is not None]
    for head, spec in PAPER_HEADS.items():
        mine = [c for c in kept if c.head == head]
        # the paper batch only, the head's own shape
        assert {c.shape for c in mine} == {spec.shape(paper_training(spec).batch_size)}
        assert sorted(c.mu for c in mine) == sorted({*FIRST_RUN_MUS, matched_mu(spec)})
        assert all(c.passes == KEPT_PASSES and c.dtype == "float32" for c in mine)
    # the summary's forward target (B1, B2 at mu = 1%, B = 16) and a crossover bracket on
    # each side of the committed crossovers (forward 20-40%, step 43-96%)
    assert 0.01 in FIRST_RUN_MUS and min(FIRST_RUN_MUS) < 0.2 and max(FIRST_RUN_MUS) == 1.0
    assert any(0.4 < mu < 1.0 for mu in FIRST_RUN_MUS)


def test_every_kernel_preset_names_a_pipeline_preset():
    for name, preset in PRESETS.items():
        assert preset.pipeline_preset in pipeline_presets.PRESETS, name
    assert FIRST.pipeline_preset == "first-run"


def test_the_first_run_pipeline_has_both_protocols_the_six_heads_and_twelve_pairs():
    pipe = pipeline_presets.PRESETS["first-run"]
    assert [h.name for h in pipe.heads] == list(PAPER_HEADS)
    assert len(pipe.seeds) >= 2  # 6 heads x 2 seeds: the Wilcoxon tests' 12 pairs
    assert pipe.protocol.engineered and set(pipe.protocol.switches) == {"fixed", "auto"}
    # the same data and early stopping as the default preset: only the probes are shorter
    default = pipeline_presets.PRESETS["default"]
    assert pipe.sizes == default.sizes
    for family in ("A", "B", "C"):
        head = next(h for h in PAPER_HEADS.values() if h.family == family)
        assert pipe.protocol.epoch_cap(head) == default.protocol.epoch_cap(head)
    assert pipe.seconds_per_cost is None or pipe.seconds_per_cost > 0


def test_long_is_the_former_default_and_default_still_names_it(capsys):
    assert ALIASES == {"default": "long"} and PRESETS["default"] is PRESETS["long"]
    long = PRESETS["long"]
    grid = {(c.head, c.shape.batch) for c in expand(long) if c.sweep == "heads"}
    assert grid == {(h, b) for h in PAPER_HEADS for b in PAPER_BATCHES}
    assert long.pipeline_preset == "default"
    assert cli.main(["--preset", "default", "--suite", "kernels", "--heads", "Z9"]) == 2
    assert "now named 'long'" in capsys.readouterr().out


# ---------------------------------------------------------------- the estimate of the time left

def test_format_duration_and_eta():
    assert format_duration(0.4) == "0 s"
    assert format_duration(42.4) == "42 s"
    assert format_duration(185) == "3 min 05 s"
    assert format_duration(3725) == "1 h 02 min"
    assert format_duration(-3) == "0 s"
    assert format_eta(185) == "about 3 min 05 s left"
    assert format_eta(None) == "estimating the time left"
    with pytest.raises(ValueError, match="seconds"):
        format_duration(float("nan"))


def test_time_left_weighs_items_by_cost():
    # 1 of 4 cost units done in 2 s: 2 s a unit, 8 s in all, 6 s left at t = 2
    assert time_left(4, 1, 1, 2.0, 2.0) == pytest.approx(6.0)
    # the 3-unit item began at t = 2; at t = 5, 3 s left
    assert time_left(4, 1, 4, 5.0, 2.0) == pytest.approx(3.0)
    # it overruns: never below what has not started
    assert time_left(4, 1, 4, 20.0, 2.0) == 0.0
    assert time_left(10, 1, 4, 20.0, 2.0) == pytest.approx(12.0)
    # nothing finished: the prior, or no estimate
    assert time_left(4, 0, 1, 1.0, 0.0, prior_s_per_cost=0.5) == pytest.approx(1.5)
    assert time_left(4, 0, 1, 1.0, 0.0) is None


def test_time_left_with_items_at_once_counts_each_items_own_time():
    # two items of cost 1 began at t = 0, side by side; one ends at t = 2 (2 s of its own):
    # 2 s an item, two at once, so 1 s of wall a unit of cost; 4 units, 2 s left at t = 2
    assert time_left(4, 1, 3, 2.0, 2.0, jobs=2, done_item_s=2.0,
                     running=((1.0, 2.0),)) == pytest.approx(2.0)
    # the elapsed rate alone (one at a time, or an item's own time unknown) says 6
    assert time_left(4, 1, 3, 2.0, 2.0) == pytest.approx(6.0)
    assert time_left(4, 1, 3, 2.0, 2.0, jobs=2, done_item_s=None) == pytest.approx(6.0)
    # a long item running alone bounds the estimate from below: cost 8 at 1 s an item-unit
    assert time_left(10, 1, 9, 1.0, 1.0, jobs=2, done_item_s=1.0,
                     running=((8.0, 0.0),)) == pytest.approx(8.0)
    # before any item ends, the prior (already per the items at once): 4 × 0.5 − 1
    assert time_left(4, 0, 2, 1.0, 0.0, prior_s_per_cost=0.5, jobs=2,
                     running=((1.0, 1.0), (1.0, 1.0))) == pytest.approx(1.0)


def test_time_left_weighs_the_prior_as_a_quarter_of_the_run():
    # 1 of 8 cost units done in 3 s against a prior of 1 s a unit: the prior counts as 2 units
    # measured at its rate, so (3 + 2) / (1 + 2) s a unit for the 7 not started; without a
    # prior, 3 s a unit
    assert time_left(8, 1, 1, 3.0, 3.0, prior_s_per_cost=1.0) == pytest.approx(7 * 5 / 3)
    assert time_left(8, 1, 1, 3.0, 3.0) == pytest.approx(7 * 3.0)
    # the measurement outweighs it as the run goes: 6 units in 18 s, (18 + 2) / (6 + 2)
    assert time_left(8, 6, 6, 18.0, 18.0, prior_s_per_cost=1.0) == pytest.approx(2 * 2.5)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_eta_bar_counts_down_by_cost_and_items_end_in_any_order():
    clock, out = FakeClock(), io.StringIO()
    with EtaBar({"a": 1.0, "b": 3.0, "c": 1.0}, desc="t", unit="item", tick_s=0, clock=clock,
                file=out) as bar:
        assert bar.seconds_left() is None and "estimating" in bar.postfix()
        bar.start("a", "first")
        bar.start("c", "third")
        clock.now += 2
        bar.finish("c")  # out of order: 1 unit in 2 s
        assert bar.seconds_left() == pytest.approx(5 * 2 - 2)
        bar.start("b", "second")
        clock.now += 3
        assert bar.seconds_left() == pytest.approx(5 * 2 - 5)
        assert bar.postfix() == "about 5 s left; second"
        with pytest.raises(ValueError, match="twice"):
            bar.finish("c")
        with pytest.raises(KeyError, match="'z'"):
            bar.start("z")
        clock.now += 10  # b overruns: no "0 s left" while it runs
        assert bar.seconds_left() == 0.0
        assert bar.postfix() == "running past the estimate; second"
        bar.update()  # the oldest unfinished: a
        assert bar.done == {"a", "c"}
        bar.finish("b")
        assert bar.postfix() == "done; second"
    assert "left" in out.getvalue() and "2/3" in out.getvalue() and "3/3" in out.getvalue()


def test_eta_bar_with_items_at_once_uses_their_own_times():
    clock = FakeClock()
    with EtaBar({"a": 1.0, "b": 1.0, "c": 2.0}, desc="t", unit="item", tick_s=0, clock=clock,
                file=io.StringIO(), jobs=2) as bar:
        bar.start("a")
        bar.start("b")
        clock.now += 2
        bar.finish("a")  # 2 s of its own for 1 unit, two at once: 1 s a unit
        assert bar.seconds_left() == pytest.approx(4 * 1.0 - 2)
        bar.start("c")  # cost 2 at 2 s an item-unit: 4 s of its own, more than the rest
        assert bar.seconds_left() == pytest.approx(4.0)
        clock.now += 1
        bar.finish("b")  # 3 s for 1 unit: 5 s for 2, 1.25 s a unit at two at once
        # c (cost 2) began 1 s ago and alone takes 2 × 2.5 = 5 s: 4 s left of it
        assert bar.seconds_left() == pytest.approx(4.0)
    with EtaBar({"a": 1.0, "b": 3.0}, desc="t", unit="item", tick_s=0, clock=clock,
                file=io.StringIO(), jobs=2) as bar:
        clock.now += 2
        bar.update()  # ended without a start: its own time unknown, the elapsed rate
        assert bar.done_item_s is None
        assert bar.seconds_left() == pytest.approx(4 * 2.0 - 2)
    with pytest.raises(ValueError, match="jobs"):
        EtaBar({"a": 1.0}, desc="t", unit="item", tick_s=0, file=io.StringIO(), jobs=0)


def test_the_first_runs_opening_estimates_fit_the_fifteen_minutes():
    """The two bars' priors are what a newcomer reads first: together with the job's other
    phases (≈ 1.5 min: install, build, ceilings, reports) they must not promise more than
    the README's 15 minutes on 2 cores, nor less than the fastest measured run's phases."""
    kernel_cost = sum(case_cost for case_cost in _first_run_case_costs())
    kernel_s = kernel_cost * FIRST.seconds_per_cost
    pipe = pipeline_presets.PRESETS["first-run"]
    costs, seconds_per_cost = pipeline_runner.bar_costs(pipe, pipeline_runner.units_of(pipe, {}))
    pipe_s = sum(costs.values()) * seconds_per_cost / 2
    assert 4 * 60 < kernel_s < 8 * 60
    assert 3 * 60 < pipe_s < 7 * 60
    assert kernel_s + pipe_s + 90 < 15 * 60


def test_a_kept_fraction_case_costs_its_dense_work_too():
    """A kept-fraction case times the dense backends and the MLP beside the sparse ones, so
    its cost is never below the same shape's without μ (priced by μ alone, B1 at μ ≈ 1% came
    to about 3 s against the 16 s it took)."""
    from bench.harness.suite import case_cost

    kept = [c for c in _first_run_cases() if c.mu is not None]
    assert kept
    for case in kept:
        dense = dataclasses.replace(case, mu=None)
        assert case_cost(dense) < case_cost(case) <= 2 * case_cost(dense)


def _first_run_cases() -> list:
    from bench.harness import runner

    return runner.cases_for(FIRST)


def _first_run_case_costs() -> list[float]:
    """The kernel bar's costs for the first-run preset, as bench/harness/runner.py makes them."""
    from bench.harness import runner
    from bench.harness.suite import case_cost

    return list(runner.shape_groups(_first_run_cases(), case_cost)[2].values())


def test_eta_bar_ticks_while_an_item_runs():
    out = io.StringIO()
    with EtaBar({"a": 1.0}, desc="t", unit="item", prior_s_per_cost=60, tick_s=0.01,
                file=out) as bar:
        bar.start("a", "long one")
        drawn = out.getvalue().count("left")
        for _ in range(200):  # up to 2 s for the thread to redraw
            if out.getvalue().count("left") > drawn:
                break
            time.sleep(0.01)
    assert out.getvalue().count("left") > drawn


def test_the_pipelines_bar_weighs_units_by_unit_cost(monkeypatch, tmp_path):
    bars = []

    class Recording(EtaBar):
        def __init__(self, costs, **kwargs):
            bars.append(self)
            super().__init__(costs, **{**kwargs, "tick_s": 0})

    preset = pipeline_presets.PRESETS["first-run"]
    monkeypatch.setattr(pipeline_runner, "EtaBar", Recording)
    for name in ("warm_up", "warm_up_shapes"):
        monkeypatch.setattr(pipeline_runner, name, lambda *a, **k: None)
    monkeypatch.setattr(pipeline_runner, "load_data",
                        lambda head, *a: types.SimpleNamespace(name="synthetic",
                                                               description="fake"))
    monkeypatch.setattr(pipeline_runner, "run_head",
                        lambda head, data, seed, protocol: [{"head": head.name, "seed": seed}])
    metas = []
    monkeypatch.setattr(pipeline_runner, "write_report_atomically",
                        lambda records, meta, out: metas.append(meta))
    records = pipeline_runner.run_config(preset, tmp_path, progress=False, jobs=1)
    assert len(records) == len(preset.heads) * len(preset.seeds)
    [bar] = bars
    units = pipeline_runner.units_of(preset, {})
    # the report keeps each unit's wall seconds (what the table was measured from)
    seconds = metas[-1]["units"]["seconds"]
    assert sorted(seconds) == sorted(pipeline_runner.unit_label(u) for u in units)
    assert all(s >= 0 for s in seconds.values())
    # the first-run preset's units are weighed by their measured seconds, at 1 s a second
    assert bar.costs == {u: preset.unit_seconds[u.head.name, u.seed] for u in units}
    assert bar.prior_s_per_cost == 1.0 and bar.jobs == 1
    assert bar.done == set(units)


def test_the_bar_falls_back_to_unit_cost_where_a_unit_was_not_measured():
    preset = pipeline_presets.PRESETS["first-run"]
    units = pipeline_runner.units_of(preset, {})
    costs, prior = pipeline_runner.bar_costs(preset, units)
    assert prior == 1.0 and costs[units[0]] == preset.unit_seconds[units[0].head.name,
                                                                   units[0].seed]
    formula = {u: pipeline_runner.unit_cost(preset, u) for u in units}
    # a seed the table lacks, or data other than synthetic: every unit by unit_cost
    extra = [*units, pipeline_runner.Unit(PAPER_HEADS["A1"], "synthetic", 2)]
    assert pipeline_runner.bar_costs(preset, extra) == (
        {**formula, extra[-1]: pipeline_runner.unit_cost(preset, extra[-1])},
        preset.seconds_per_cost)
    digits = [pipeline_runner.Unit(u.head, "digits", u.seed) for u in units]
    assert pipeline_runner.bar_costs(preset, digits)[1] == preset.seconds_per_cost
    # the table is the CPU's: a run on another device is weighed by unit_cost
    on_gpu = dataclasses.replace(preset, protocol=dataclasses.replace(preset.protocol,
                                                                      device="cuda"))
    assert pipeline_runner.bar_costs(on_gpu, units) == (formula, preset.seconds_per_cost)
    quick = pipeline_presets.PRESETS["quick"]
    assert quick.unit_seconds is None
    assert pipeline_runner.bar_costs(quick, units)[0] == {
        u: pipeline_runner.unit_cost(quick, u) for u in units}


# ---------------------------------------------------------------- phases and the total

def test_phases_print_each_phase_and_the_total():
    clock = FakeClock()
    phases = Phases(clock=clock)
    with phases.phase("cases"):
        clock.now += 61
    phases.add("pipeline", 30)
    phases.add("pipeline", 10)
    clock.now += 50
    lines = phases.lines("job")
    assert lines[0] == "job: 111 s in all (1 min 51 s)"
    assert lines[1].split() == ["cases", "61.0", "s"]
    assert lines[2].split() == ["pipeline", "40.0", "s"]
    assert lines[3].split() == ["other", "10.0", "s"]
    with pytest.raises(ValueError, match="seconds"):
        phases.add("bad", -1)


def test_the_run_prints_its_phases_and_total(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(PRESETS, "tiny", Preset(
        "tiny", "", (Sweep("heads", ("A2",), "batch", (2,)),), ("float32",),
        passes=("forward",), min_time_s=0.01, rounds=2, ceiling_time_s=0.02))
    fake = types.ModuleType("bench.pipeline")
    fake.run = lambda preset, out_dir: None
    monkeypatch.setitem(sys.modules, "bench.pipeline", fake)
    real_find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec",
                        lambda name: object() if name == "bench.pipeline" else real_find_spec(name))
    assert cli.main(["--preset", "tiny", "--backends", "torch", "--no-plots",
                     "--out", str(tmp_path / "k"), "--pipeline-out", str(tmp_path / "p"),
                     "--history", str(tmp_path / "h")]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    total = next(i for i, line in enumerate(lines) if line.startswith("glai-bench run: "))
    assert "s in all" in lines[total]
    named = [line.split("  ")[1].strip() for line in lines[total + 1:] if line.startswith("  ")]
    for phase in ("kernel suite: set-up", "kernel suite: ceilings", "kernel suite: cases",
                  "kernel suite: reports", "history and dashboard", "pipeline (tiny preset)"):
        assert phase in named
    assert "left" in out.err  # the kernel suite's bar and its estimate


def test_nox_bench_builds_the_extension_as_a_phase_and_prints_the_total(monkeypatch):
    fake_nox = types.ModuleType("nox")
    fake_nox.options = types.SimpleNamespace()
    fake_nox.Session = object
    fake_nox.session = lambda f: f
    monkeypatch.setitem(sys.modules, "nox", fake_nox)
    namespace: dict = {"__file__": str(ROOT / "noxfile.py"), "__name__": "noxfile"}
    exec(compile((ROOT / "noxfile.py").read_text(), "noxfile.py", "exec"), namespace)

    class Session:
        def __init__(self) -> None:
            self.posargs: list[str] = []
            self.calls: list[tuple] = []

        def install(self, *args):
            self.calls.append(("install", *args))

        def run(self, *args):
            self.calls.append(("run", *args))

        def log(self, line):
            self.calls.append(("log", line))

    session = Session()
    namespace["bench"](session)
    runs = [c[1:] for c in session.calls if c[0] == "run"]
    assert runs[0] == ("python", "-m", "glai_kernels")  # the build, before the suite
    # the command's preset, within what the 15 minutes leave (here the "install" took no time)
    assert runs[1][:4] == ("glai-bench", "run", "--install-dispatch", "--time-limit")
    assert 880 <= int(runs[1][4]) <= 890
    logs = [c[1] for c in session.calls if c[0] == "log"]
    assert "sized to answer within 15 minutes" in logs[0] and "--time-limit" in logs[0]
    assert logs[1].startswith("nox -s bench: ") and "s in all" in logs[1]
    assert [line.split("  ")[1] for line in logs[2:5]] == [
        "venv and install", "extension build (python -m glai_kernels)",
        "glai-bench run (its phases above)"]
    # arguments of the user's own: exactly those, no limit
    session = Session()
    session.posargs = ["--preset", "first-run"]
    namespace["bench"](session)
    assert [c[1:] for c in session.calls if c[0] == "run"][1] == (
        "glai-bench", "run", "--install-dispatch", "--preset", "first-run")


def test_one_time_limit_for_both_suites_caps_the_kernels_and_gives_the_pipeline_the_rest(
        tmp_path, monkeypatch):
    limits = {}

    def kernels(*args, time_limit_s=None, **kwargs):
        limits["kernels"] = time_limit_s
        return types.SimpleNamespace(table=[], meta={}, files=[])

    monkeypatch.setattr("bench.harness.suite.run", kernels)
    monkeypatch.setattr(cli, "run_pipeline", lambda preset, out, shard, time_limit_s=None:
                        limits.__setitem__("pipeline", time_limit_s))
    argv = ["--device", "cpu", "--no-history", "--out", str(tmp_path / "k"),
            "--pipeline-out", str(tmp_path / "p"), "--time-limit", "500"]
    assert cli.main(argv) == 0
    assert limits["kernels"] == pytest.approx(500 * cli.KERNEL_SHARE)
    assert 495 < limits["pipeline"] <= 500  # the kernels took no time here
    limits.clear()
    assert cli.main([*argv, "--suite", "kernels"]) == 0
    assert limits == {"kernels": 500}
    assert cli.main(argv[:-2]) == 0
    assert limits == {"kernels": None, "pipeline": None}


def test_under_a_limit_the_units_start_seed_by_seed():
    units = pipeline_runner.units_of(pipeline_presets.PRESETS["first-run"], {})
    unlimited = pipeline_runner.launch_order(units, limited=False)
    assert [(u.head.name, u.seed) for u in unlimited[:4]] == [
        ("B1", 0), ("B1", 1), ("B2", 0), ("B2", 1)]
    limited = pipeline_runner.launch_order(units, limited=True)
    assert [u.seed for u in limited] == [0] * 6 + [1] * 6
    assert [u.head.name for u in limited[:6]] == ["B1", "B2", "C1", "C2", "A1", "A2"]
    assert sorted(map(str, limited)) == sorted(map(str, units))


def test_a_units_need_is_its_prior_at_the_pace_seen_so_far():
    a, b, c = (pipeline_runner.Unit(PAPER_HEADS[h], "synthetic", 0) for h in ("A1", "B1", "C1"))
    clock = pipeline_runner.RunClock(time.monotonic() + 100, 100, report_s=5,
                                     priors={a: 10.0, b: 40.0})
    assert clock.need_s(None, b) == 0 and clock.need_s(30, b) == 30  # no unit ended yet
    clock.ended(a, 20.0)  # twice its prior: this machine's pace
    assert clock.pace == 2 and clock.need_s(None, b) == 80 and clock.starts(None, b)
    assert clock.need_s(30, b) == 30  # at most the unit time limit
    clock.ended(b, 40.0)  # faster than the pace: the largest ratio stays
    assert clock.pace == 2 and clock.longest_unit_s == 40
    assert clock.need_s(None, c) == 60  # no prior: half as long again as the longest
    assert not pipeline_runner.RunClock(time.monotonic() + 50, 50, report_s=5,
                                        priors={b: 40.0}, pace=2.0).starts(None, b)


def _units_inline(monkeypatch) -> None:
    """The pipeline's unit "processes" run their target in this one when started, and a
    unit's work is one record naming its seed: `_run_processes` without spawning."""
    class Inline:
        def __init__(self, target, args, daemon):
            self.target, self.args, self.exitcode = target, args, None

        def start(self):
            self.target(*self.args)
            self.exitcode = 0

        def is_alive(self):
            return False

        def join(self, timeout=None):
            pass

    monkeypatch.setattr(pipeline_runner.multiprocessing, "get_context",
                        lambda kind: types.SimpleNamespace(Process=Inline))
    monkeypatch.setattr(pipeline_runner, "_run_unit",
                        lambda preset, unit, files, threads: ([{"seed": unit.seed}], "d", "", 0.0))


def test_a_unit_that_cannot_finish_is_passed_over_for_a_shorter_one(monkeypatch):
    _units_inline(monkeypatch)
    b1 = [pipeline_runner.Unit(PAPER_HEADS["B1"], "synthetic", s) for s in (0, 1)]
    a2 = pipeline_runner.Unit(PAPER_HEADS["A2"], "synthetic", 1)
    # B1's second seed would need 100 s at the pace seen, A2's 1 s: 60 s are left
    clock = pipeline_runner.RunClock(time.monotonic() + 60, 60, report_s=5, pace=1.0,
                                     priors={b1[0]: 1.0, b1[1]: 100.0, a2: 1.0})
    ended = []
    pipeline_runner._run_processes(pipeline_presets.PRESETS["first-run"], [*b1, a2], {}, 1, 1,
                                   None, lambda unit, outcome, status: ended.append(
                                       (unit.head.name, unit.seed, status)), None, clock)
    assert ended == [("B1", 0, "ok"), ("B1", 1, "not run"), ("A2", 1, "ok")]


def test_units_in_processes_tell_the_bar_each_start(monkeypatch):
    # three units, two at a time: the third starts after the first ends (a parameter once
    # shadowed by the loop's start time failed exactly there, "'float' object is not callable")
    _units_inline(monkeypatch)
    preset = pipeline_presets.PRESETS["first-run"]
    units = [pipeline_runner.Unit(PAPER_HEADS["A1"], "synthetic", s) for s in range(3)]
    started, ended = [], []
    pipeline_runner._run_processes(preset, units, {}, 1, 2, None,
                                   lambda unit, outcome, status: ended.append((unit, status)),
                                   started.append)
    assert started == units and [status for _, status in ended] == ["ok"] * 3


def test_a_time_limited_run_says_which_units_its_pipeline_left_out(tmp_path):
    results = tmp_path / "results.json"
    units = {"planned": ["A1 on synthetic, seed 0", "B1 on synthetic, seed 1"],
             "done": ["A1 on synthetic, seed 0"], "not_run": ["B1 on synthetic, seed 1"],
             "cut_off": []}
    results.write_text(json.dumps({"meta": {"units": units}}))
    line = cli.units_left_out(results, "first-run")
    assert line.startswith("pipeline: 1 of 2 units ran; the time limit left out B1 on "
                           "synthetic, seed 1") and "--preset first-run" in line
    units.update(done=units["planned"], not_run=[])
    results.write_text(json.dumps({"meta": {"units": units}}))
    assert cli.units_left_out(results, "first-run").endswith("2 of 2 units ran within the "
                                                             "time limit")
    assert "no report to read" in cli.units_left_out(tmp_path / "none.json", "first-run")
