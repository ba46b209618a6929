"""The 100% guard: no result may take less time than its roofline floor.

A share ("% of roofline") is floor / measured median, the floor max(FLOPs / peak,
bytes / bandwidth) from the contract's minimum counts (docs/ARCHITECTURE.md §2) and the run's
physical ceilings (bench/harness/ceilings.py). Above 100% a kernel would have beaten the hardware:
the model (a ceiling too low, a count too high) is wrong, and the run says so instead of
printing the number as an achievement.

`recompute` takes a run's rows (results.json, a history record) and its recorded ceilings
and recomputes every timed row's share from its median: dense rows with today's contract
counts, rows that carry their own counts (the kept-fraction sweep's) with those.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from bench.harness.ceilings import Ceilings
from bench.harness.passes import PASSES, dtype_of
from glai_kernels.contract import Shape

LIMIT_PCT = 100.0
MODEL_WRONG = "model wrong"
STALE = "reports predate physical ceilings: re-run glai-bench run"


def _floor(row: pd.Series, ceilings: Ceilings) -> float:
    flops, nbytes = row.get("flops", math.nan), row.get("bytes", math.nan)
    if pd.isna(row.get("mu", math.nan)) and row["pass"] in PASSES:
        shape = Shape(int(row["batch"]), int(row["inputs"]), int(row["paths"]),
                      int(row["outputs"]))
        spec = PASSES[row["pass"]]
        flops, nbytes = spec.flops(shape), spec.min_bytes(shape, dtype_of(row["dtype"]).itemsize)
    if pd.isna(flops) or pd.isna(nbytes):
        return math.nan
    return ceilings.floor_s(float(flops), int(nbytes), row["dtype"])


def recompute(rows: pd.DataFrame, ceilings: Ceilings) -> pd.Series:
    """% of roofline of every timed row ("ok" or "wrong") from its median_s; NaN elsewhere."""
    timed = rows["status"].isin(["ok", "wrong"]) & rows["median_s"].notna()
    floors = rows[timed].apply(_floor, axis=1, ceilings=ceilings)
    return (100 * floors / rows.loc[timed, "median_s"]).reindex(rows.index)


def over_limit(rows: pd.DataFrame, shares: pd.Series) -> pd.DataFrame:
    """The rows whose share exceeds 100%, with the share as `share_pct`."""
    bad = shares > LIMIT_PCT
    return rows[bad].assign(share_pct=shares[bad])


def describe(bad: pd.DataFrame) -> list[str]:
    """One line per offending row: backend, pass, dtype, shape, share."""
    return [f"{r['backend']} {r['pass']} {r['dtype']} B={r['batch']} I={r['inputs']} "
            f"P={r['paths']} O={r['outputs']}: {r['share_pct']:.0f}% ({MODEL_WRONG})"
            for _, r in bad.iterrows()]


def committed_runs(root: Path) -> list[Path]:
    """Every JSON file under `root` that records a run: ceilings and rows."""
    found = []
    for path in sorted(root.rglob("*.json")):
        try:
            head = path.read_text()[:200_000]
        except OSError:
            continue
        if '"ceilings"' in head and '"rows"' in head:
            found.append(path)
    return found


def check_run(path: Path) -> tuple[str | None, list[str]]:
    """(why it cannot be checked or None, the offending rows) of one recorded run: shares
    recomputed from its raw times under its recorded physical ceilings; a run recorded
    without physical ceilings cannot be judged (its ceiling was the library GEMM)."""
    data = json.loads(path.read_text())
    ceilings = Ceilings(**data["ceilings"])
    if not ceilings.physical:
        return STALE, []
    rows = pd.DataFrame(data["rows"])
    return None, describe(over_limit(rows, recompute(rows, ceilings)))
