"""The layout crossover table from a kept-fraction sweep's `step` pass
(bench/harness/crossover_table.py): written from a synthetic result, read back by the package
(glai_kernels/dispatch/crossover.py), installed only when asked."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bench.harness import crossover_table
from bench.harness.sweeps import matched_keep
from glai_kernels.dispatch import crossover
from glai_kernels.paper_heads import PAPER_HEADS

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

KIND = "cuda-Fake-GPU-sm90"
DENSE_S = 1e-3


def _rows(head: str, batch: int, ratios: dict[float, float], backend: str = "sparse:cuda",
          dense: str = "cuda") -> list[dict]:
    """A head's step rows: the sparse step at DENSE_S * ratio per μ, the dense one at DENSE_S,
    the MLP's, and a forward row that must not count."""
    out = []
    for mu, ratio in ratios.items():
        nnz = 1000 + int(1e4 * mu)  # never a head's matched K
        assert nnz != matched_keep(PAPER_HEADS[head])
        for name, seconds, step in ((backend, DENSE_S * ratio, "step"), (dense, DENSE_S, "step"),
                                    ("mlp", DENSE_S, "step"), (backend, 1.0, "forward")):
            out.append({"backend": name, "head": head, "batch": batch, "mu": mu, "pass": step,
                        "status": "ok", "median_s": seconds, "nnz": nnz})
    return out


def _result() -> pd.DataFrame:
    rows = []
    # A1 at B = 16: sparse half the dense time at 10%, twice it at 50%: the log-interpolated
    # crossing is sqrt(0.1 * 0.5)
    rows += _rows("A1", 16, {0.01: 0.2, 0.1: 0.5, 0.5: 2.0, 1.0: 3.0})
    # B1 at B = 16: sparse faster at every μ measured: no claim beyond the largest (50%)
    rows += _rows("B1", 16, {0.01: 0.1, 0.1: 0.3, 0.5: 0.9})
    # A1 at B = 256 crosses lower, but the training batches (<= 32) decide
    rows += _rows("A1", 256, {0.01: 0.5, 0.1: 2.0})
    # the pruned head at its matched K is another structure: left out even though slower
    matched = _rows("C1", 16, {0.3: 5.0})
    for r in matched:
        r["nnz"] = matched_keep(PAPER_HEADS["C1"])
    return pd.DataFrame(rows + matched)


META = {"provenance": {"device": "cuda", "commit": "abc", "date": "2026-11-27",
                       "device_name": "Fake GPU", "threads": 16}, "command": "glai-bench run"}


def test_the_table_is_written_from_the_step_pass_and_read_back(tmp_path):
    meta = dict(META)
    written = crossover_table.write_for_run(_result(), meta, tmp_path, kind=KIND)
    assert written == [tmp_path / "dispatch" / f"{KIND}.layout_crossover.json"]
    expected = math.sqrt(0.1 * 0.5)
    assert meta["layout_crossover"]["crossover"] == pytest.approx(expected, rel=1e-5)
    table = crossover_table.build(_result(), META, KIND)
    by_case = {(c["head"], c["batch"]): c["crossover"] for c in table["cases"]}
    assert by_case[("B1", 16)] == 0.5 and by_case[("A1", 256)] < expected
    assert ("C1", 16) not in by_case
    crossover.clear_cache()
    found = crossover.for_kind(KIND, (37, 385, 128), tmp_path / "dispatch")
    assert found.source == "measured"
    assert found.fraction == pytest.approx(expected, rel=1e-5)


def test_dense_winning_everywhere_gives_zero_and_no_step_pass_gives_no_table(tmp_path):
    df = pd.DataFrame(_rows("A2", 16, {0.01: 1.5, 0.5: 4.0}))
    assert crossover_table.build(df, META, KIND)["crossover"] == 0.0
    forward_only = df[df["pass"] == "forward"]
    assert crossover_table.build(forward_only, META, KIND) is None
    assert crossover_table.write_for_run(forward_only, dict(META), tmp_path, kind=KIND) == []


def test_install_copies_into_the_package_only_when_asked(tmp_path, monkeypatch):
    package = tmp_path / "glai_kernels" / "dispatch"
    package.mkdir(parents=True)
    monkeypatch.setattr(crossover_table.dispatch, "TABLE_DIR", package)
    crossover_table.write_for_run(_result(), dict(META), tmp_path / "run", kind=KIND)
    assert not list(package.iterdir())
    meta = dict(META)
    crossover_table.write_for_run(_result(), meta, tmp_path / "run", install_table=True,
                                  kind=KIND)
    assert (package / f"{KIND}.layout_crossover.json").exists()
    assert meta["layout_crossover"]["installed"].endswith(f"{KIND}.layout_crossover.json")
