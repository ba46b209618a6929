"""Tests of the benchmark suite itself: sweeps and presets, skips, the table's schema, the
correctness gate, ceilings, provenance, plots, the command line."""

from __future__ import annotations

import json
import math
import sys
import time
import types

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
import torch

from bench import __main__ as cli
from bench.harness import ceilings, memory, provenance, results, runner, suite, timing
from bench.harness.ceilings import Ceilings
from bench.harness.energy import EnergyMeter, ImplausibleEnergyError
from bench.harness.oracle import Oracle
from bench.harness.passes import PASSES, make_call
from bench.harness.sweeps import PAPER_BATCHES, PRESETS, KeptSweep, Preset, Sweep, expand
from bench.reporting import history, plots, render
from glai_kernels import registry
from glai_kernels.contract import Shape
from glai_kernels.paper_heads import PAPER_HEADS
from reference import listing1_backward, listing1_forward

CPU = torch.device("cpu")
# a small real head (A2: I=769, P=64, O=4) at tiny batches, and the kept-fraction sweep at
# A1, B = 16, μ = 50% and the matched 2.96%: every chart has data and the run takes seconds
TINY = Preset(
    name="tiny",
    description="test preset",
    sweeps=(Sweep("heads", ("A2",), "batch", (2, 5)),
            Sweep("paths@A2", ("A2",), "paths", (3, 8), batch=3),
            KeptSweep("kept_fraction", ("A1",), batches=(16,), mus=(0.5,))),
    dtypes=("float32",),
    min_time_s=0.02,
    rounds=2,
    max_call_s=1.0,
    ceiling_time_s=0.02,
)
FAST = ["einsum", "torch"]


# ---------------------------------------------------------------- sweeps and presets

def test_every_sweep_varies_only_its_axis():
    for preset in PRESETS.values():
        for sweep in preset.sweeps:
            if isinstance(sweep, KeptSweep):  # varies μ, not the shape (test_sparse_sweep.py)
                continue
            for head, shape in sweep.shapes():
                base = PAPER_HEADS[head].shape(sweep.batch).as_dict()
                got = shape.as_dict()
                assert {k for k in base if base[k] != got[k]} <= {sweep.axis}
                assert got[sweep.axis] in sweep.values


def test_default_and_full_cover_the_six_heads_at_the_paper_batches():
    for name in ("default", "full"):
        cases = expand(PRESETS[name])
        grid = {(c.head, c.shape.batch) for c in cases if c.sweep == "heads"}
        assert grid == {(h, b) for h in PAPER_HEADS for b in PAPER_BATCHES}
        assert {"batch", "inputs", "paths", "outputs"} <= {
            c.sweep.split("@")[0] for c in cases if c.sweep != "heads"}
        assert {c.shape for c in cases if c.head == "A1" and c.shape.batch == 256} >= {
            PAPER_HEADS["A1"].shape(256)}


def test_quick_preset_is_small_and_all_float32():
    cases = expand(PRESETS["quick"])
    assert {c.dtype for c in cases} == {"float32"}
    assert len({c.shape for c in cases}) <= 8
    assert all(set(c.passes) <= set(PASSES) for c in cases)


def test_overrides_and_bad_names():
    cases = expand(PRESETS["default"], dtypes=("bfloat16",), passes=("train",))
    # the axis sweeps are float32-only, so asking for bfloat16 keeps only the heads
    assert {c.sweep for c in cases} == {"heads"}
    assert all(c.dtype == "bfloat16" and c.passes == ("train",) for c in cases)
    with pytest.raises(ValueError, match="unknown heads"):
        Sweep("x", ("Z9",), "batch", (1,))
    with pytest.raises(ValueError, match="axis"):
        Sweep("x", ("A1",), "width", (1,))
    with pytest.raises(ValueError, match="unknown pass"):
        runner.cases_for(PRESETS["quick"], None, ["sideways"])
    with pytest.raises(ValueError, match="unknown dtype"):
        runner.cases_for(PRESETS["quick"], ["float8"], None)
    kept = runner.cases_for(PRESETS["default"], heads=["A1"], batches=[256], passes=["both"])
    assert kept and all(c.head == "A1" and c.shape.batch == 256 for c in kept)
    one = runner.cases_for(PRESETS["default"], heads=["A1"], batches=[256], sweeps=["heads"],
                           dtypes=["float32"])
    assert [(c.sweep, c.shape) for c in one] == [("heads", PAPER_HEADS["A1"].shape(256))]
    # the cases follow --heads' order (a lease puts the heads it has not measured first),
    # the preset's own order within a head
    both = runner.cases_for(PRESETS["default"], heads=["C2", "A1"], sweeps=["heads"])
    heads_seen = list(dict.fromkeys(c.head for c in both))
    assert heads_seen == ["C2", "A1"]
    preset_order = runner.cases_for(PRESETS["default"], heads=["A1"], sweeps=["heads"])
    assert [c for c in both if c.head == "A1"] == preset_order
    with pytest.raises(ValueError, match="unknown sweep"):
        runner.cases_for(PRESETS["quick"], sweeps=["sideways@A1"])
    with pytest.raises(ValueError, match="unknown head"):
        runner.cases_for(PRESETS["quick"], heads=["Z9"])
    with pytest.raises(ValueError, match="no case"):
        runner.cases_for(PRESETS["quick"], batches=[3])


def test_pass_costs_come_from_the_contract():
    s = Shape(3, 5, 7, 11)
    b, i, p, o = 3, 5, 7, 11
    assert PASSES["forward"].flops(s) == 2 * b * i * p * o
    # the minimum: dx and dweight a forward's work each, dact 2·B·O·P from the kept Z
    assert PASSES["both"].flops(s) == 3 * PASSES["forward"].flops(s) + 2 * b * o * p
    assert PASSES["backward"].flops(s) == 2 * PASSES["forward"].flops(s) + 2 * b * o * p
    assert PASSES["train"].flops(s) == 2 * PASSES["forward"].flops(s)
    forward = b * i + b * p + o * i * p + b * o
    # train: the forward, then read dy, x, act and write dweight
    assert PASSES["train"].min_bytes(s, 4) == 4 * (forward + b * o + b * i + b * p + o * i * p)
    assert PASSES["backward"].min_bytes(s, 2) == 2 * (b * o + 2 * (b * i + b * p + o * i * p))


# ---------------------------------------------------------------- skipping

def _ctx(backends=FAST, **kw) -> runner.Context:
    ceil = kw.pop("ceilings", Ceilings({"float32": 1e10}, 1e10))
    return runner.Context(kw.pop("preset", TINY), CPU, list(backends), ceil,
                          log=lambda _: None, **kw)


def test_a_case_too_big_for_memory_is_skipped_with_a_note(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 50 * 2**20)
    # A1 at B=4096: the oracle alone needs more than 50 MiB
    out = runner.measure_shape(_ctx(), PAPER_HEADS["A1"].shape(4096), "float32", ["forward"])
    assert {m["status"] for m in out.values()} == {"skipped"}
    assert all("free" in m["note"] for m in out.values())


def test_a_backend_too_big_for_memory_is_skipped_while_others_run(monkeypatch):
    shape = Shape(64, 65, 64, 2)  # einsum's [B, I, P] is 1 MiB, torch needs ~0.1 MiB
    need = {b: memory.estimate_bytes(b, shape, PASSES["forward"], 4) for b in FAST}
    assert need["einsum"] > need["torch"]
    free = memory.oracle_bytes(shape, runner.CHUNK_BYTES) + (need["einsum"] + need["torch"]) // 2
    monkeypatch.setattr(memory, "available_bytes", lambda device: int(free / 0.7))
    out = runner.measure_shape(_ctx(), shape, "float32", ["forward"])
    assert out[("forward", "einsum")]["status"] == "skipped"
    assert "free" in out[("forward", "einsum")]["note"]
    assert out[("forward", "torch")]["status"] == "ok"


def test_a_case_beyond_the_presets_time_limit_is_skipped():
    slow = Ceilings({"float32": 10.0}, 10.0)  # a machine doing 10 FLOP/s
    out = runner.measure_shape(_ctx(ceilings=slow), Shape(2, 3, 4, 5), "float32",
                               ["forward", "both"])
    assert {m["status"] for m in out.values()} == {"skipped"}
    assert all("roofline floor" in m["note"] for m in out.values())


def _deadline_passes_after(monkeypatch, step: str) -> runner.Context:
    """A context whose run's deadline passes once runner.`step` has been called."""
    ctx = _ctx(deadline=time.monotonic() + 3600)
    original = getattr(runner, step)

    def then_deadline(*args, **kwargs):
        out = original(*args, **kwargs)
        ctx.deadline = time.monotonic() - 1
        return out

    monkeypatch.setattr(runner, step, then_deadline)
    return ctx


def test_shapes_past_the_runs_time_limit_are_written_as_skipped(monkeypatch):
    cases = runner.cases_for(TINY, heads=["A2"], sweeps=["heads"])
    assert len({c.shape for c in cases}) == 2
    in_time = runner.run_cases(_ctx(), cases, progress=False)
    assert {r["status"] for r in in_time} == {"ok"}
    ctx = _deadline_passes_after(monkeypatch, "measure_shape")
    late = runner.run_cases(ctx, cases, progress=False)
    assert [(r["batch"], r["pass"], r["backend"]) for r in late] == \
        [(r["batch"], r["pass"], r["backend"]) for r in in_time]
    first, second = (r for r in late if r["batch"] == 2), (r for r in late if r["batch"] == 5)
    assert {r["status"] for r in first} == {"ok"}
    assert all(r["status"] == "skipped" and "time limit" in r["note"] for r in second)


def test_backends_past_the_runs_time_limit_are_skipped_within_a_shape(monkeypatch):
    """A first call may autotune for tens of seconds on a GPU: the limit is checked before
    each backend too, not only between shapes."""
    ctx = _deadline_passes_after(monkeypatch, "_prepare")
    out = runner.measure_shape(ctx, Shape(3, 5, 4, 2), "float32", ["forward", "both"])
    assert out[("forward", FAST[0])]["status"] == "ok"
    rest = [m for key, m in out.items() if key != ("forward", FAST[0])]
    assert len(rest) == 3 and all("time limit" in m["note"] for m in rest)


def test_a_backend_too_slow_to_time_is_skipped_after_two_calls():
    calls = []

    def sleepy(x, act, weight):
        calls.append(1)
        time.sleep(0.05)
        return listing1_forward(x, act, weight)

    registry.register(registry.Backend("sleepy", sleepy, listing1_backward, ("cpu",), "slow"))
    try:
        preset = Preset("strict", "", (), ("float32",), max_call_s=0.01)
        out = runner.measure_shape(_ctx(["einsum", "sleepy"], preset=preset), Shape(2, 3, 4, 5),
                                   "float32", ["forward"])
    finally:
        registry.unregister("sleepy")
    assert out[("forward", "sleepy")]["status"] == "skipped"
    assert "a call took" in out[("forward", "sleepy")]["note"]
    assert len(calls) == 2
    assert out[("forward", "einsum")]["status"] == "ok"


def test_estimates_name_the_big_intermediates():
    s = Shape(256, 385, 128, 37)
    both = PASSES["both"]
    assert memory.estimate_bytes("einsum", s, both, 4) >= 2 * 4 * 256 * 385 * 128
    # a backend that gives no workspace estimate is assumed fused: its inputs and results only
    registry.register(registry.Backend("someone_new", listing1_forward, listing1_backward,
                                       ("cpu",), "fused, says its registration"))
    try:
        fused = memory.estimate_bytes("someone_new", s, both, 4)
    finally:
        registry.unregister("someone_new")
    assert fused < memory.estimate_bytes("torch", s, both, 4)
    assert fused >= 4 * (s.min_elements("forward"))


def test_estimates_come_from_the_backends_registration():
    s = Shape(8, 9, 10, 3)
    forward = PASSES["forward"]

    def workspace(shape, is_forward, grads):
        return 1000 if is_forward else 10 * len(grads)

    for name, ws in (("plain_new", None), ("with_workspace", workspace)):
        registry.register(registry.Backend(name, listing1_forward, listing1_backward, ("cpu",),
                                           "a test backend", workspace=ws))
    try:
        extra = (memory.estimate_bytes("with_workspace", s, forward, 4)
                 - memory.estimate_bytes("plain_new", s, forward, 4))
        assert extra == 4 * 1000
        assert memory.workspace_elements("with_workspace", s, PASSES["backward"]) == 30
        assert memory.workspace_elements("with_workspace", s, PASSES["both"]) == 1000
    finally:
        registry.unregister("plain_new")
        registry.unregister("with_workspace")


def test_cpu_allocation_peak_sees_a_temporary():
    def make_and_drop():
        t = torch.ones(2**20)  # 4 MiB, freed before the result is made
        return t.sum()

    peak = memory.peak_bytes(make_and_drop, CPU)
    assert peak is not None and peak >= 4 * 2**20


# ---------------------------------------------------------------- timing, ceilings, oracle

def test_timing_statistics():
    t = timing.Timing.of([1.0, 2.0, 3.0, 4.0, 100.0], calls=5)
    assert (t.median_s, t.min_s, t.samples) == (3.0, 1.0, 5)
    assert t.q25_s == 2.0 and t.q75_s == 4.0 and t.iqr_s == 2.0
    assert timing.block_size(1e-3, 0.1, 5) == 20
    assert timing.block_size(1.0, 0.1, 5) == 1


def test_interleaved_timer_times_every_function():
    fns = {"a": lambda: torch.ones(10).sum(), "b": lambda: torch.ones(10000).sum()}
    out = timing.time_interleaved(fns, {"a": 1e-5, "b": 1e-5}, min_time_s=0.02, rounds=3)
    assert set(out) == {"a", "b"}
    assert all(t.samples == 3 and 0 < t.min_s <= t.median_s for t in out.values())


def test_ceilings_are_positive_and_pick_the_right_bound():
    peak, n = ceilings.matmul_peak(torch.float32, CPU, min_time_s=0.02, sizes=(64, 128))
    assert peak > 0 and n in (64, 128)
    assert ceilings.copy_bandwidth(CPU, 2**22, min_time_s=0.02) > 0
    c = Ceilings({"float32": 1e11}, 1e10, cache_copy_bytes_per_s=1e11, cache_bytes=2**20)
    assert c.bound(10**12, 10**6, "float32") == "compute"
    assert c.bound(10**3, 2**18, "float32") == "cache"     # fits in half the cache
    assert c.bound(10**3, 2**24, "float32") == "memory"
    assert c.floor_s(10**3, 2**24, "float32") == pytest.approx(2**24 / 1e10)
    assert math.isnan(c.floor_s(1, 1, "float16"))


def test_chunked_oracle_equals_whole_and_judges():
    shape = Shape(9, 5, 4, 3)
    t = runner.make_sets(shape, torch.float32, CPU, seed=1)[0]
    whole, chunked = Oracle(t), Oracle(t, chunk_bytes=8 * 5 * 4 * 2)  # 2 rows per chunk
    assert chunked.rows == 2
    for name in ("y",):
        assert torch.allclose(whole.forward[name][0], chunked.forward[name][0], rtol=1e-12)
    for name in ("dx", "dact", "dweight"):
        assert torch.allclose(whole.gradients[name][0], chunked.gradients[name][0],
                              rtol=1e-12, atol=1e-14)
    good = make_call("torch", PASSES["both"], [t])()
    assert chunked.error_ratio(good) <= 1.0
    bad = dict(good, dweight=good["dweight"] * 1.01)
    assert chunked.error_ratio(bad) > 1.0


def test_the_oracle_rejects_a_wrong_output_dtype():
    """The benchmarks judge as the correctness suite does (`reference.verdict`): float32 inputs
    whose result comes back as bfloat16 are wrong, although its values would pass bfloat16's
    own tolerance."""
    t = runner.make_sets(Shape(3, 4, 2, 2), torch.float32, CPU, seed=2)[0]
    oracle = Oracle(t)
    good = make_call("torch", PASSES["forward"], [t])()
    assert oracle.error_ratio(good) <= 1.0
    assert oracle.error_ratio({"y": good["y"].to(torch.bfloat16)}) == math.inf


def test_energy_is_absent_on_the_cpu():
    meter = EnergyMeter(CPU)
    assert not meter.available and "cpu" in meter.reason
    assert meter.measure(lambda: None, 1e-3) is None


def test_energy_arithmetic_against_a_fake_nvml(monkeypatch):
    """NVML counts millijoules; a constant 250 W must read back as 250 W and
    250 W x window / calls joules per call, over at least the minimum window."""
    start = time.perf_counter()
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i),
        nvmlDeviceGetTotalEnergyConsumption=lambda h: int(250e3 * (time.perf_counter() - start)),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    assert "turned off" in EnergyMeter(torch.device("cuda", 0), window_s=0).reason
    meter = EnergyMeter(torch.device("cuda", 0), window_s=0.2)
    assert meter.available, meter.reason
    energy = meter.measure(lambda: time.sleep(0.002), per_call_s=0.002)
    assert 0.2 <= energy.window_s < 0.5 and energy.calls >= 10
    assert energy.watts == pytest.approx(250, rel=0.05)
    assert energy.joules_per_call == pytest.approx(250 * energy.window_s / energy.calls, rel=0.05)
    assert "at least 0.2 s" in meter.describe() and "rough" in meter.describe()
    # a board that reports its limit: 250 W passes under 300 W and is refused under 200 W
    fake.nvmlDeviceGetEnforcedPowerLimit = lambda h: 300_000
    assert EnergyMeter(torch.device("cuda", 0), window_s=0.2).measure(
        lambda: time.sleep(0.002), per_call_s=0.002).watts == pytest.approx(250, rel=0.05)
    fake.nvmlDeviceGetEnforcedPowerLimit = lambda h: 200_000
    with pytest.raises(ImplausibleEnergyError, match="above the board's 200 W limit"):
        EnergyMeter(torch.device("cuda", 0), window_s=0.2).measure(
            lambda: time.sleep(0.002), per_call_s=0.002)


# ---------------------------------------------------------------- a whole run

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bench")
    # the kept-fraction sweep with the sparse `torch` backend only, whatever else is available
    output = suite.run(TINY, device="cpu", backends=[*FAST, "sparse:torch"], out_dir=out_dir,
                       progress=False, log=lambda _: None)
    return output, out_dir


def test_csv_has_the_schema_and_one_row_per_measurement(tiny_run):
    _, out_dir = tiny_run
    df = pd.read_csv(out_dir / "results.csv")
    assert list(df.columns) == list(results.COLUMNS)
    keys = [c for c in results.KEY_COLUMNS if c != "mu"]
    assert df[keys].notna().all().all()
    kept = df["sweep"] == "kept_fraction"
    assert df.loc[kept, "mu"].notna().all() and df.loc[~kept, "mu"].isna().all()
    # heads: 1 head x 2 batches; paths sweep: 2 values; 4 passes; 2 backends
    assert (~kept).sum() == (2 + 2) * 4 * 2
    # kept fraction: 2 μ x 2 passes x (sparse:torch, dense torch, mlp)
    assert kept.sum() == 2 * 2 * 3
    assert not df.duplicated(list(results.KEY_COLUMNS)).any()
    assert set(df["status"]) == {"ok"} and df["correct"].all()
    ok = df[df["status"] == "ok"]
    assert (ok["median_s"] > 0).all() and (ok["iqr_s"] >= 0).all()
    costed = ok[ok["flops"].notna()]  # a kept-fraction step row has no cost model
    assert costed.index.equals(ok[~((ok["sweep"] == "kept_fraction")
                                    & (ok["pass"] == "step"))].index)
    # the CSV keeps 6 significant digits (results.write: "%.6g"), each of the three numbers
    # within 5e-6 of its value: the quotient within 1.5e-5 (1e-5 failed once on a fresh run)
    assert np.allclose(costed["gflops"], costed["flops"] / costed["median_s"] / 1e9,
                       rtol=3 * 5e-6, atol=0)
    assert np.allclose(df.loc[df["backend"] == "einsum", "speedup_vs_baseline"], 1.0)
    assert (ok["peak_mem_bytes"] > 0).all()
    assert df["energy_j"].isna().all()  # no NVML on a CPU: absent, not zero
    # one winner per shape x dtype x pass (counted once across sweeps)
    winners = df[df["winner"]].drop_duplicates(results.MEASUREMENT_KEY)
    assert len(winners) == len(df.drop_duplicates(results.COMPARISON_KEY))
    for name in provenance.ROW_FIELDS:
        assert df[name].notna().all()


def test_json_and_summary(tiny_run):
    output, out_dir = tiny_run
    data = json.loads((out_dir / "results.json").read_text())
    assert data["provenance"]["device"] == "cpu"
    assert data["ceilings"]["copy_bytes_per_s"] > 0
    assert len(data["rows"]) == len(output.table)
    summary = (out_dir / "summary.md").read_text()
    assert "## Winning backend per paper head" in summary
    assert "| A2 |" in summary and "cpu" in summary
    for name in plots.CHARTS:
        assert f"plots/{name}" in summary
    # the GPU roofline predictions, labelled as predictions (their renderer once failed here)
    assert "## Roofline predictions (datasheet peaks; predictions, not measurements)" in summary
    assert "bench.reporting.predict failed" not in summary


def test_the_run_writes_its_dispatch_table(tiny_run):
    from glai_kernels import dispatch

    output, out_dir = tiny_run
    kind = dispatch.machine_kind("cpu")
    tables = sorted((out_dir / "dispatch").glob("*.json"))
    # the dense op's table, and the sparse op's and the layout crossover from the kept-fraction
    # sweep (its step pass: bench/harness/crossover_table.py)
    assert [p.name for p in tables] == [f"{kind}.json", f"{kind}.layout_crossover.json",
                                        f"{kind}.sparse_estimator.json"]
    assert output.meta["layout_crossover"]["file"] == f"dispatch/{kind}.layout_crossover.json"
    table = dispatch.Table.from_dict(json.loads(tables[0].read_text()))
    # FAST runs einsum (never an auto candidate) and torch: torch wins every cell
    assert table.entries and {e.winner for e in table.entries} == {"torch"}
    assert table.provenance["preset"] == "tiny"
    assert output.meta["dispatch"]["table"]["cases"] > 0
    summary = (out_dir / "summary.md").read_text()
    assert "## auto: the measured dispatch table" in summary
    # the kept sweep ran sparse:torch alone: it wins the sparse op's every cell
    sparse_table = dispatch.Table.from_dict(json.loads(tables[2].read_text()))
    assert sparse_table.op == "sparse_estimator"
    assert {e.winner for e in sparse_table.entries} == {"torch"}
    assert {e.mode for e in sparse_table.entries} <= {"forward", "train"}
    assert output.meta["sparse_dispatch"]["table"]["cases"] > 0
    assert "## the sparse op's auto: the measured dispatch table" in summary


def test_every_chart_is_written_and_not_blank(tiny_run):
    _, out_dir = tiny_run
    for name in plots.CHARTS:
        image = matplotlib.image.imread(out_dir / "plots" / name)
        assert image.shape[0] > 200 and image.shape[1] > 200
        # a chart with content has many pixels away from the background
        assert (np.abs(image[..., :3] - image[0, 0, :3]).sum(-1) > 0.1).mean() > 0.02


def test_render_redraws_from_the_files_alone(tiny_run):
    _, out_dir = tiny_run
    for path in (out_dir / "plots").glob("*.png"):
        path.unlink()
    (out_dir / "summary.md").unlink()
    written = render.render(out_dir)
    assert {p.name for p in written} == {*plots.CHARTS, "summary.md"}
    assert "## Winning backend per paper head" in (out_dir / "summary.md").read_text()


def test_provenance_fields():
    info = provenance.collect(CPU)
    for name in (*provenance.ROW_FIELDS, "device", "cpu_count", "python_version"):
        assert info[name] not in (None, ""), name
    assert info["threads"] == torch.get_num_threads()
    assert info["torch_version"] == torch.__version__


# ---------------------------------------------------------------- the correctness gate

def _zeros_forward(x, act, weight):
    return x.new_zeros(x.shape[0], weight.shape[0])


def _zeros_backward(dy, x, act, weight, needs, saved=None):
    return tuple(torch.zeros_like(t) if n else None for t, n in zip((x, act, weight), needs,
                                                                   strict=True))


@pytest.fixture
def wrong_backends():
    """A fast wrong backend (all zeros) and a slow-ish wrong one (weight read transposed)."""
    def transposed(x, act, weight):
        o, i, p = weight.shape
        return listing1_forward(x, act, weight.reshape(o, p, i).transpose(1, 2).contiguous())

    names = ["zeros_fast", "transposed"]
    registry.register(registry.Backend("zeros_fast", _zeros_forward, _zeros_backward,
                                       ("cpu",), "deliberately wrong: returns zeros"))
    registry.register(registry.Backend("transposed", transposed, listing1_backward,
                                       ("cpu",), "deliberately wrong: weight transposed"))
    yield names
    for name in names:
        registry.unregister(name)


def test_a_wrong_backend_is_flagged_and_never_wins(wrong_backends):
    preset = Preset("gate", "", (Sweep("heads", ("A2",), "batch", (3,)),), ("float32",),
                    passes=("forward", "both"), min_time_s=0.02, rounds=2, ceiling_time_s=0.02)
    table = suite.run(preset, device="cpu", backends=["einsum", *wrong_backends],
                      progress=False, log=lambda _: None).table
    wrong = table[table["backend"].isin(wrong_backends)]
    assert len(wrong) == 4
    assert (wrong["status"] == "wrong").all() and (~wrong["correct"].astype(bool)).all()
    assert (wrong["error_ratio"] > 1).all() and not wrong["winner"].any()
    assert wrong["note"].str.contains("oracle").all()
    # zeros are faster than einsum, yet einsum wins every case
    assert table[table["backend"] == "einsum"]["winner"].all()


def test_an_unavailable_backend_is_reported_with_its_reason():
    registry.register(registry.Backend("unicorn", _zeros_forward, _zeros_backward, ("cpu",),
                                       "needs a unicorn",
                                       availability=lambda d: "no unicorn on this machine"))
    messages = []
    try:
        names, unavailable = runner.select_backends(["torch", "unicorn"], CPU, messages.append)
    finally:
        registry.unregister("unicorn")
    assert names == ["einsum", "torch"]  # the baseline joins
    assert unavailable == {"unicorn": "no unicorn on this machine"}
    assert any("unicorn" in m and "no unicorn on this machine" in m for m in messages)
    with pytest.raises(ValueError, match="registered backends"):
        runner.select_backends(["nope"], CPU)


# ---------------------------------------------------------------- command line

def test_cli_writes_everything_and_calls_the_pipeline(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(PRESETS, "tiny", Preset(
        "tiny", "", (Sweep("heads", ("A2",), "batch", (2,)),), ("float32",),
        passes=("forward",), min_time_s=0.01, rounds=2, ceiling_time_s=0.02))
    calls = []
    fake = types.ModuleType("bench.pipeline")
    fake.run = lambda preset, out_dir: calls.append((preset, out_dir))
    monkeypatch.setitem(sys.modules, "bench.pipeline", fake)
    real_find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec",
                        lambda name: object() if name == "bench.pipeline" else real_find_spec(name))
    rc = cli.main(["--preset", "tiny", "--backends", "torch", "--no-progress", "--no-plots",
                   "--out", str(tmp_path / "k"), "--pipeline-out", str(tmp_path / "p"),
                   "--history", str(tmp_path / "h")])
    assert rc == 0
    assert (tmp_path / "k" / "results.csv").exists() and (tmp_path / "k" / "summary.md").exists()
    assert calls == [("tiny", tmp_path / "p")]
    [record] = history.load(tmp_path / "h")
    assert record.preset == "tiny" and {r["backend"] for r in record.rows} == {"einsum", "torch"}
    assert "kernel suite" in capsys.readouterr().out


def test_cli_pipeline_absent_is_a_message(monkeypatch, capsys):
    real_find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec",
                        lambda name: None if name == "bench.pipeline" else real_find_spec(name))
    assert cli.run_pipeline("quick", cli.ROOT / "unused") is False
    assert "not present" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_rejects_cuda_without_a_gpu_and_unknown_backends(capsys):
    assert cli.main(["--suite", "kernels", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert cli.main(["--suite", "kernels", "--backends", "nope", "--device", "cpu"]) == 2
    assert "registered backends" in capsys.readouterr().err
