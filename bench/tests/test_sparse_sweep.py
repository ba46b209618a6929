"""Tests of the kept-fraction sweep (bench/harness/kept.py, bench/reporting/kept_report.py): its
cases, a tiny run's rows and verdicts, its chart and its summary lines, and the `mu` column where
the history and the dashboard read it."""

from __future__ import annotations

import math

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
import torch

from bench.harness import kept, results, runner
from bench.harness.ceilings import Ceilings
from bench.harness.sweeps import (
    KEPT_MUS,
    PRESETS,
    KeptSweep,
    Preset,
    expand,
    matched_keep,
    matched_mu,
)
from bench.reporting import dashboard, history, kept_report, plots, summary
from glai_kernels.paper_heads import PAPER_HEADS

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

CPU = torch.device("cpu")
# A1 at B = 16 and two μ (50% and the matched 2.96%): seconds
TINY_KEPT = Preset(name="tiny-kept", description="test preset",
                   sweeps=(KeptSweep("kept_fraction", ("A1",), batches=(16,), mus=(0.5,)),),
                   dtypes=("float32",), min_time_s=0.02, rounds=2, max_call_s=1.0,
                   ceiling_time_s=0.02)


def test_matched_mu_is_docs_table():
    # docs/ARCHITECTURE.md §3: K = orig. − R − O
    expected = {"A1": 53_979, "A2": 49_468, "B1": 450_752, "B2": 344_320, "C1": 74_491,
                "C2": 197_884}
    assert {h: matched_keep(PAPER_HEADS[h]) for h in PAPER_HEADS} == expected
    assert matched_mu(PAPER_HEADS["B1"]) == pytest.approx(0.0086, abs=1e-4)


def test_default_preset_sweeps_mu_at_every_head_and_quick_is_unchanged():
    cases = [c for c in expand(PRESETS["default"]) if c.mu is not None]
    for head, spec in PAPER_HEADS.items():
        mine = [c for c in cases if c.head == head]
        batches = {c.shape.batch for c in mine}
        assert batches >= {16, 256}
        for batch in batches:
            mus = sorted(c.mu for c in mine if c.shape.batch == batch)
            assert set(KEPT_MUS) <= set(mus) and matched_mu(spec) in mus
            assert len(mus) == len(set(mus))
        assert all(c.shape == spec.shape(c.shape.batch) for c in mine)  # the head's own shape
        assert all(c.passes == ("forward", "step") and c.dtype == "float32" for c in mine)
    # C2's paper batch is 32
    assert 32 in {c.shape.batch for c in cases if c.head == "C2"}
    assert not [c for c in expand(PRESETS["quick"]) if c.mu is not None]


def test_overrides_select_the_sweeps_passes_and_dtype():
    forward = [c for c in expand(PRESETS["default"], passes=("forward",)) if c.mu is not None]
    assert forward and all(c.passes == ("forward",) for c in forward)
    assert not [c for c in expand(PRESETS["default"], passes=("both",)) if c.mu is not None]
    assert not [c for c in expand(PRESETS["default"], dtypes=("bfloat16",))
                if c.mu is not None]
    assert runner.cases_for(PRESETS["default"], passes=["step"], heads=["A1"],
                            sweeps=["kept_fraction"])
    with pytest.raises(ValueError, match="mus"):
        KeptSweep("bad", ("A1",), mus=(0.0,))
    with pytest.raises(ValueError, match="unknown passes"):
        KeptSweep("bad", ("A1",), passes=("both",))


def test_masks_are_exact_and_nested():
    shape = PAPER_HEADS["A1"].shape(4)
    inputs = kept.head_inputs("A1", shape, torch.float32, CPU, seed=0)
    small, large = (kept_mask(inputs, kept.kept_count(shape, mu)) for mu in (0.01, 0.1))
    assert int(small.sum()) == kept.kept_count(shape, 0.01)
    assert int(large.sum()) == round(0.1 * shape.inputs * shape.paths * shape.outputs)
    assert not (small & ~large).any()
    assert set(inputs.act.unique().tolist()) <= {0.0, 1.0}  # the selector's gates


def kept_mask(inputs, nnz):
    return kept.kept_mask(inputs, nnz)


def test_the_matched_mu_is_the_pruned_head():
    """At the matched K the sweep times the head GLAI trains: the prune's mask over the
    head's own estimator weight and selector, its entries in fewer (o, s) groups than a
    random mask's of the same K; any other K gets no pruned mask."""
    shape, keep = PAPER_HEADS["A1"].shape(4), matched_keep(PAPER_HEADS["A1"])
    pruned = kept.pruned_inputs("A1", shape, torch.float32, CPU, seed=0)
    mask = kept_mask(pruned, keep)
    assert mask.shape == (shape.outputs, shape.inputs, shape.paths)
    assert int(mask.sum()) == keep
    with pytest.raises(ValueError, match="keeps"):
        kept_mask(pruned, keep - 1)
    random = kept_mask(kept.head_inputs("A1", shape, torch.float32, CPU, seed=0), keep)

    def groups(m):
        return int(m.any(1).sum())  # (o, s) pairs with a kept entry
    assert groups(mask) < groups(random) / 2
    assert set(pruned.act.unique().tolist()) <= {0.0, 1.0}


@pytest.fixture(scope="module")
def kept_rows():
    # the sparse `torch` backend only: the rows and the summary's "not available" line
    # must not change when another sparse backend becomes available here
    ctx = runner.Context(TINY_KEPT, CPU, ["einsum", "torch"],
                         Ceilings({"float32": 1e10}, 1e10), log=lambda _: None,
                         sparse_backends=["torch"])
    rows = runner.run_cases(ctx, expand(TINY_KEPT), progress=False)
    table = results.table(rows, ctx.ceilings, {})
    return table


def test_a_tiny_run_gives_every_backend_with_a_correct_verdict(kept_rows):
    df = kept_rows
    labels = {"sparse:torch", "torch", "mlp"}
    assert set(df["backend"]) == labels  # einsum is not in kept.DENSE
    assert len(df) == 2 * 2 * len(labels)
    assert set(df["status"]) == {"ok"} and df["correct"].all()
    assert (df["error_ratio"] <= 1).all()
    matched = matched_keep(PAPER_HEADS["A1"])
    assert set(df["nnz"]) == {matched, round(0.5 * 385 * 128 * 37)}
    forward = df[df["pass"] == "forward"]
    assert forward["flops"].notna().all() and forward["roofline_pct"].notna().all()
    sparse = forward[forward["backend"] == "sparse:torch"]
    # SparseShape: 2·B·(K + G), G <= K; the dense op on the masked weight: 2·B·O·I·P
    assert (sparse["flops"] > 2 * 16 * sparse["nnz"]).all()
    assert (sparse["flops"] <= 4 * 16 * sparse["nnz"]).all()
    dense = forward[forward["backend"] == "torch"]
    assert (dense["flops"] == 2 * 16 * 385 * 128 * 37).all()
    # one winner per μ and pass, never the MLP
    winners = df[df["winner"]]
    assert len(winners) == 4 and "mlp" not in set(winners["backend"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_step_pass_on_cuda_is_judged_and_correct():
    """On a GPU every backend's step rows are timed and judged: the float64 oracle sits on the
    CPU, the layout's entries and mask on the GPU (an H200 lease's step rows all failed
    indexing across the two, and the sparse `cuda` step called a CPU-only update, stop 48)."""
    from glai_kernels.sparse import SPARSE_ESTIMATOR

    sparse = [b for b in ("cuda", "torch") if SPARSE_ESTIMATOR.availability(b, "cuda") is None]
    preset = Preset(name="tiny-kept-cuda", description="test preset",
                    sweeps=(KeptSweep("kept_fraction", ("A1",), batches=(16,), mus=(0.5,),
                                      passes=("step",)),),
                    dtypes=("float32",), min_time_s=0.02, rounds=2, max_call_s=1.0,
                    ceiling_time_s=0.02)
    ctx = runner.Context(preset, torch.device("cuda"), ["einsum", "torch"],
                         Ceilings({"float32": 1e10}, 1e10), log=lambda _: None,
                         sparse_backends=sparse)
    df = results.table(runner.run_cases(ctx, expand(preset), progress=False), ctx.ceilings, {})
    assert set(df["backend"]) == {*(f"sparse:{b}" for b in sparse), "torch", "mlp"}
    assert set(df["status"]) == {"ok"}, df[["backend", "mu", "status", "note"]]
    assert df["correct"].all() and (df["error_ratio"] <= 1).all()


def test_a_wrong_sparse_backend_is_flagged(monkeypatch):
    from glai_kernels.registry import Backend
    from glai_kernels.sparse import SPARSE_ESTIMATOR

    def zeros(x, act, values, index):
        return x.new_zeros(x.shape[0], index.shape[0])

    def zeros_backward(dy, x, act, values, index, needs, saved=None):
        return tuple(t.new_zeros(t.shape) if n else None
                     for t, n in zip((x, act, values), needs, strict=True))

    SPARSE_ESTIMATOR.register(Backend("zeros_test", zeros, zeros_backward, ("cpu",), "wrong"))
    try:
        ctx = runner.Context(TINY_KEPT, CPU, ["einsum"], Ceilings({"float32": 1e10}, 1e10),
                             log=lambda _: None, sparse_backends=["zeros_test"])
        case = [c for c in expand(TINY_KEPT) if c.mu == 0.5]
        df = results.table(runner.run_cases(ctx, case, progress=False), ctx.ceilings, {})
    finally:
        SPARSE_ESTIMATOR.unregister("zeros_test")
    wrong = df[df["backend"] == "sparse:zeros_test"]
    assert set(wrong["status"]) == {"wrong"} and not wrong["winner"].any()
    assert set(df[df["backend"] == "mlp"]["status"]) == {"ok"}


def _meta() -> dict:
    ceil = Ceilings({"float32": 1e10}, 1e10)
    return {"provenance": {"machine": "test", "device_name": "cpu", "threads": 1,
                           "torch_version": torch.__version__, "commit": "abc", "date":
                           "2026-11-23T00:00:00", "device": "cpu"},
            "ceilings": ceil.as_dict()}


def test_the_chart_is_written_and_not_blank(kept_rows, tmp_path):
    path = plots.kept_fraction(kept_rows, _meta(), tmp_path / "kept_fraction.png")
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 200
    assert (np.abs(image[..., :3] - image[0, 0, :3]).sum(-1) > 0.1).mean() > 0.02


def test_the_summary_lines(kept_rows):
    text = "\n".join(kept_report.markdown(kept_rows, _meta()))
    assert "## Sparse kept-path estimator: the kept-fraction sweep" in text
    assert "### Crossover" in text and "| A1 | 16 |" in text
    assert "share of the bytes floor" in text and "sparse:torch" in text
    # target (1): A1's paper batch is 16, measured here; target (2) needs sparse cpp
    assert "| A1 | 16 | 2.96% |" in text
    assert ("**met**" in text) or ("**missed**" in text)
    assert "Not available: no sparse `cpp` backend ran" in text


def _synthetic(sparse_ms, dense_ms, mus=(0.01, 0.1, 0.5)) -> pd.DataFrame:
    rows = []
    for mu, s, d in zip(mus, sparse_ms, dense_ms, strict=True):
        rows += [{"backend": "sparse:torch", "mu": mu, "median_s": s / 1e3},
                 {"backend": "cpp", "mu": mu, "median_s": d / 1e3}]
    return pd.DataFrame(rows)


def test_crossover_interpolates_in_log_mu():
    mu, text = kept_report.crossover(_synthetic([1, 4, 20], [10, 10, 10]))
    assert 0.1 < mu < 0.5 and "between 10% and 50%" in text
    # at the geometric midpoint when the log ratios are symmetric
    mu, _ = kept_report.crossover(_synthetic([1, 2, 8], [4, 4, 4], mus=(0.01, 0.04, 0.16)))
    assert mu == pytest.approx(0.08)
    assert kept_report.crossover(_synthetic([1, 2, 3], [10, 10, 10]))[0] is None
    assert "dense faster" in kept_report.crossover(_synthetic([9, 9, 9], [1, 1, 1]))[1]


def test_the_forward_target_with_a_sparse_cpp():
    rows = []
    for head in ("B1", "B2"):
        for backend, ms in (("sparse:cpp", 1.0), ("cpp", 25.0)):
            rows.append({"backend": backend, "head": head, "batch": 16, "pass": "forward",
                         "mu": 0.01, "median_s": ms / 1e3, "status": "ok"})
    df = pd.DataFrame(rows)
    text = "\n".join(kept_report._forward_target(kept_report.kept_rows(df), df))
    assert text.count("25.0×: **met**") == 2


def test_summary_page_with_kept_rows(kept_rows):
    meta = {**_meta(), "baseline": "einsum", "command": "test", "elapsed_s": 1.0,
            "preset": {"name": "tiny-kept", "description": "d", "dtypes": ["float32"]},
            "backends": ["torch", "sparse:torch"], "unavailable": {},
            "memory_method": "m", "energy": "absent"}
    page = summary.render(kept_rows, meta)
    assert "kept-fraction sweep" in page and "## Wrong results" in page
    assert "**Note:**" not in page
    # a run whose oneDNN was limited by bench/harness/onednn_guard.py says so at the top
    meta["provenance"] = {**meta["provenance"], "onednn_guard": "oneDNN limited (test)"}
    assert "**Note:** oneDNN limited (test)." in summary.render(kept_rows, meta)


def test_history_keeps_mu_and_reads_records_without_it(kept_rows, tmp_path):
    import json

    rows = json.loads(kept_rows.drop(columns=[]).to_json(orient="records"))
    prov = {"commit": "abc", "date": "2026-11-23T00:00:00", "machine": "test", "device": "cpu"}
    new = history.append({"provenance": prov, "rows": rows, "baseline": "einsum"}, tmp_path)
    old_rows = [{k: v for k, v in r.items() if k not in ("mu", "nnz")} for r in rows[:2]]
    for r in old_rows:
        r["backend"] = "einsum"
    old = history.append({"provenance": {**prov, "date": "2026-11-22T00:00:00"},
                          "rows": old_rows, "baseline": "einsum"}, tmp_path)
    records = history.load(tmp_path)
    assert [r.path for r in records] == [old, new]
    frame = history.frame(records)
    assert frame["mu"].isna().sum() == 2 and frame["mu"].notna().sum() == len(rows)
    assert not math.isnan(frame["nnz"].dropna().iloc[0])
    page = dashboard.render(records, tmp_path / "index.html")
    assert page.exists()
