"""`glai-bench merge` (bench/reporting/merge.py): runs of one machine kind, taken in pieces within a
short lease, as one report whose dispatch table is built over all their cases."""

from __future__ import annotations

import json
import math

import pytest

from bench.harness.ceilings import Ceilings
from bench.reporting import merge
from bench.tests.helpers import MERGE_KIND as KIND
from bench.tests.helpers import table_row as _row
from bench.tests.helpers import write_run as _run

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores


@pytest.fixture
def two_runs(tmp_path):
    # one cell (B = 256, I = 384/385) split across the runs: cpp wins it only over both
    first = _run(tmp_path, "first", [_row("torch", 256, 10.0), _row("cpp", 256, 5.0)],
                 Ceilings({"float32": 1e11}, 1e10))
    second = _run(tmp_path, "second", [_row("torch", 256, 10.0, inputs=385),
                                       _row("cpp", 256, 11.0, inputs=385)],
                  Ceilings({"bfloat16": 4e11}, 2e10))
    return first, second


def test_one_report_over_both_runs(two_runs, tmp_path):
    table, meta = merge.merge([merge.load(r) for r in two_runs])
    assert len(table) == 4
    assert meta["command"] == "glai-bench run --out first ; glai-bench run --out second"
    assert [m["rows"] for m in meta["merged_from"]] == [2, 2]
    # each ceiling the best of the runs', over both runs' dtypes
    assert meta["ceilings"]["matmul_flops"] == {"float32": 1e11, "bfloat16": 4e11}
    assert meta["ceilings"]["copy_bytes_per_s"] == 2e10
    out = tmp_path / "merged"
    merge.write(table, meta, out, plots=False)
    written = json.loads((out / "dispatch" / f"{KIND}.json").read_text())
    cell = next(e for e in written["entries"] if e["batch_bucket"] == 256)
    assert cell["cases"] == 2 and cell["winner"] == "cpp"
    assert cell["slowdown"]["cpp"] == pytest.approx(math.sqrt(1.1), rel=1e-3)
    assert written["provenance"]["measured"] == ["cpp", "torch"]
    report = json.loads((out / "results.json").read_text())
    assert report["dispatch"]["table"] == {"within": 1, "cases": 2}
    page = (out / "summary.md").read_text()
    assert "Merged from 2 runs" in page and "| 2 |" in page
    assert "glai-bench run --out second" in page


def test_refuses_a_measurement_taken_twice(two_runs):
    runs = [merge.load(r) for r in two_runs]
    with pytest.raises(ValueError, match=r"appear in more than one run.*backend=torch"):
        merge.merge([runs[0], runs[0]])


def test_refuses_runs_of_different_machines(two_runs, tmp_path):
    other = _run(tmp_path, "other", [_row("torch", 16, 1.0)], Ceilings({"float32": 1e11}, 1e10),
                 machine="elsewhere")
    with pytest.raises(ValueError, match="one machine kind"):
        merge.merge([merge.load(two_runs[0]), merge.load(other)])
    other = _run(tmp_path, "kind", [_row("torch", 16, 1.0)], Ceilings({"float32": 1e11}, 1e10),
                 kind="cuda-Other-GPU-sm80")
    with pytest.raises(ValueError, match="several machine kinds"):
        merge.merge([merge.load(two_runs[0]), merge.load(other)])


def test_a_shape_skipped_in_one_run_and_measured_in_another_is_kept_as_measured(tmp_path):
    ceilings = Ceilings({"float32": 1e11}, 1e10)
    cut = _run(tmp_path, "cut", [_row("torch", 16, 1.0), _row("torch", 256, 0.0, status="skipped"),
                                 _row("cpp", 256, 0.0, status="skipped")], ceilings)
    rest = _run(tmp_path, "rest",
                [_row("torch", 256, 10.0), _row("cpp", 256, 0.0, status="skipped")], ceilings)
    table, _ = merge.merge([merge.load(cut), merge.load(rest)])
    got = sorted(zip(table["backend"], table["batch"], table["status"], strict=True))
    assert got == [("cpp", 256, "skipped"), ("torch", 16, "ok"), ("torch", 256, "ok")]


def test_keeps_only_the_named_backends_of_a_run(two_runs, tmp_path):
    ceilings = Ceilings({"float32": 1e11}, 1e10)
    # a run of a new backend that also timed torch beside it, at a shape `first` measured
    extra = _run(tmp_path, "extra", [_row("torch", 256, 12.0), _row("triton", 256, 4.0)],
                 ceilings)
    with pytest.raises(ValueError, match="more than one run"):
        merge.merge([merge.load(two_runs[0]), merge.load(extra)])
    table, meta = merge.merge([merge.load(two_runs[0]), merge.load(f"{extra}:triton")])
    assert sorted(table["backend"]) == ["cpp", "torch", "triton"]
    assert table.loc[table["backend"] == "torch", "median_s"].item() == pytest.approx(0.01)
    assert "(rows of triton only)" in meta["command"]
    with pytest.raises(ValueError, match=r"no rows of backend\(s\) \['cuda'\]"):
        merge.load(f"{extra}:cuda")


def test_repeated_runs_keep_each_measurements_median_run(tmp_path):
    ceilings = Ceilings({"float32": 1e11}, 1e10)
    runs = [_run(tmp_path, f"r{k}", [_row("torch", 16, ms), _row("cpp", 16, 2.0 + k, status=st,
                                                                  correct=st == "ok")],
                 ceilings)
            for k, (ms, st) in enumerate([(1.0, "ok"), (3.0, "wrong"), (2.0, "ok")])]
    loaded = [merge.load(r) for r in runs]
    with pytest.raises(ValueError, match="more than one run"):
        merge.merge(loaded)
    table, meta = merge.merge(loaded, repeats=True)
    assert len(table) == 2 and [m["rows"] for m in meta["merged_from"]] == [2, 2, 2]
    torch_row = table[table["backend"] == "torch"].iloc[0]
    assert torch_row["median_s"] == pytest.approx(2e-3)  # of 1, 3 and 2 ms
    assert "median of 3 runs' medians (1000-3000 us)" in torch_row["note"]
    # cpp was wrong in one run of three: the measurement stays wrong
    cpp_row = table[table["backend"] == "cpp"].iloc[0]
    assert cpp_row["status"] == "wrong" and cpp_row["median_s"] == pytest.approx(3e-3)
    # an even count keeps the lower middle
    table, _ = merge.merge(loaded[:1] + loaded[2:], repeats=True)
    assert table.loc[table["backend"] == "torch", "median_s"].item() == pytest.approx(1e-3)
