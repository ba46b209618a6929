"""What the dashboard shows, as data: the summary of the latest run and the plots' series.

- `summary(df, runs, band)`: per machine, dtype, head and pass at the paper's batch, each
  backend's speedup over the baseline in the latest run against the previous run and against
  the best of the ten before it, each change marked when it is beyond the noise band;
- `series(df, runs)`: every (machine, dtype, pass, head, batch, backend) line of the paper
  heads across the runs (speedup, % of roofline, ms), JSON-ready for the page's script.

`df` is `history.frame(records)` with a `run` column: the run's index among its machine's runs,
oldest first; `runs` maps each machine to its runs (`run_table`).
"""

from __future__ import annotations

import math

import pandas as pd

from bench.gate.store import load_baseline
from bench.harness.sweeps import PAPER_BATCHES
from bench.reporting import history
from glai_kernels.paper_heads import PAPER_HEADS

# the paper's batch: the summary's and the plots' default (the sweeps add the larger ones)
PAPER_BATCH = PAPER_BATCHES[0]
# the gate's default per-case floor (bench/gate/store.py, build_baseline's case_floor), a
# |log change|: used when the machine has no committed gate baseline naming its own
DEFAULT_BAND = 0.10
BEST_OF = 10
KEPT_PASS = "kept forward"  # the kept-fraction sweep's forward at the head's matched μ


def noise_band(machine: str) -> tuple[float, str]:
    """(|log change| beyond which a change is marked, where it comes from) for `machine`.

    The history holds no repeated runs of unchanged code to measure its own spread, so the
    band is the regression gate's per-case floor (its committed baseline's, else its default).
    """
    try:
        baseline = load_baseline(machine)
    except ValueError:  # an unreadable baseline: the default still says something
        baseline = None
    if baseline is not None and "case_floor" in baseline:
        return float(baseline["case_floor"]), "its committed baseline's"
    return DEFAULT_BAND, "its default"


def old_roofline_model(record: history.Record) -> bool:
    """True when the record's % of roofline came from the old ceiling model: before the
    physical ceilings (issue 15), a run recorded no native FMA peak (`peak_flops`) and took the
    library GEMM's rate as its compute ceiling."""
    return "peak_flops" not in record.ceilings


def run_table(records: list[history.Record]) -> dict[str, list[dict]]:
    """machine -> its runs oldest first: record path, short commit, date, old roofline model."""
    runs: dict[str, list[dict]] = {}
    for i, r in enumerate(records):
        runs.setdefault(r.machine, []).append(
            {"record": str(r.path or i), "commit": r.commit[:7], "date": r.date[:16],
             "old_model": old_roofline_model(r)})
    return runs


def is_paper_shape(df: pd.DataFrame) -> pd.Series:
    """Rows of the dense op at a paper head's own I, P, O (any batch; no kept fraction)."""
    def own(row) -> bool:
        head = PAPER_HEADS.get(row.head)
        return head is not None and (row.inputs, row.paths, row.outputs) == (
            head.inputs, head.paths, head.outputs)
    mask = [own(r) for r in df[["head", "inputs", "paths", "outputs"]].itertuples(index=False)]
    return pd.Series(mask, index=df.index, dtype=bool) & df["mu"].isna()


def _matched_kept(df: pd.DataFrame) -> pd.Series:
    """Kept-fraction forward rows at each head's matched μ."""
    from bench.harness.sweeps import matched_keep

    mask = [h in PAPER_HEADS and pd.notna(n) and n == matched_keep(PAPER_HEADS[h])
            for h, n in zip(df["head"], df["nnz"], strict=True)]
    return (pd.Series(mask, index=df.index, dtype=bool) & df["mu"].notna()
            & (df["pass"] == "forward"))


def _change(latest: float | None, ref: float | None, band: float) -> dict | None:
    if latest is None or ref is None or not ref > 0 or not latest > 0:
        return None
    log = math.log(latest / ref)
    mark = "worse" if log < -band else "better" if log > band else ""
    return {"pct": 100 * math.expm1(log), "mark": mark}


def _value(x: object) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def summary(df: pd.DataFrame, runs: dict[str, list[dict]],
            bands: dict[str, float]) -> list[dict]:
    """One row per (machine, dtype, head, pass) of the latest run at the paper's batch:
    {machine, dtype, pass, head, cells: {backend: {latest, prev, best, vs_prev, vs_best}}}.

    `vs_prev` / `vs_best`: {pct, mark} with mark "worse" / "better" beyond `bands[machine]`
    (a |log change|), or None when a side is missing. The baseline backend has no cell (its
    speedup is 1 by definition).
    """
    ok = df[(df["status"] == "ok") & (df["batch"] == PAPER_BATCH)]
    ok = ok[is_paper_shape(ok)]
    out = []
    for (machine, dtype, pass_, head), sub in ok.groupby(["machine", "dtype", "pass", "head"]):
        last = len(runs[machine]) - 1
        if last not in set(sub["run"]):
            continue  # the latest run did not measure it: nothing to compare
        cells = {}
        for backend, line in sub.groupby("backend"):
            if backend in set(line["baseline"]):
                continue
            by_run = {int(r): _value(v) for r, v in zip(line["run"], line["speedup_vs_baseline"],
                                                       strict=True)}
            latest = by_run.get(last)
            if latest is None:
                continue
            prev = by_run.get(last - 1)
            window = [v for r, v in by_run.items() if last - BEST_OF <= r < last and v]
            best = max(window) if window else None
            band = bands[machine]
            cells[backend] = {"latest": latest, "prev": prev, "best": best,
                              "vs_prev": _change(latest, prev, band),
                              "vs_best": _change(latest, best, band)}
        if cells:
            out.append({"machine": machine, "dtype": dtype, "pass": pass_, "head": head,
                        "cells": cells})
    order = {h: i for i, h in enumerate(PAPER_HEADS)}
    return sorted(out, key=lambda r: (r["machine"], r["dtype"], r["pass"],
                                      order.get(r["head"], 99)))


def _rounded(values: list[float | None]) -> list[float | None]:
    return [None if v is None else float(f"{v:.4g}") for v in values]


def series(df: pd.DataFrame, runs: dict[str, list[dict]]) -> list[dict]:
    """Every line the plots can draw: {m, d, p, h, b, k (backend), s (speedup), r (% of
    roofline), t (median ms)}, each list one value (or None) per run of machine m."""
    ok = df[df["status"] == "ok"]
    dense, kept = ok[is_paper_shape(ok)], ok[_matched_kept(ok)].assign(**{"pass": KEPT_PASS})
    out = []
    for (m, d, p, h, b, k), line in pd.concat([dense, kept]).groupby(
            ["machine", "dtype", "pass", "head", "batch", "backend"]):
        n = len(runs[m])
        s, r, t = [None] * n, [None] * n, [None] * n
        for row in line.itertuples(index=False):
            s[row.run], r[row.run] = _value(row.speedup_vs_baseline), _value(row.roofline_pct)
            t[row.run] = None if _value(row.median_s) is None else 1e3 * row.median_s
        out.append({"m": m, "d": d, "p": p, "h": h, "b": int(b), "k": k,
                    "s": _rounded(s), "r": _rounded(r), "t": _rounded(t)})
    return out
