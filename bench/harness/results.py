"""The tidy results table: one row per (sweep, head, backend, shape, dtype, pass, device).

Raw measurements come from `bench.harness.runner`; this module adds what follows from them and the
contract: FLOPs and fewest bytes (`Shape.flops` / `Shape.min_bytes` via `bench.harness.passes`),
GFLOP/s, GB/s, arithmetic intensity, the roofline floor and % of it under this run's
ceilings, the speedup over the registry's baseline backend (`registry.baseline()`, einsum for
the dense op) measured in the same run (of the medians: `speedup_vs_baseline`; of the fastest
samples, steadier on a loaded machine: `speedup_best`), the ratio to the best peer
(`vs_best_peer`: the fastest correct median among bench/harness/peers.py's peers and the `torch`
backend, over the row's median; above 1 means faster than anything a user would write
instead), and the winner of each (shape, dtype, pass): the fastest (median) backend whose
outputs matched the oracle (a bench-only peer never wins: it is not a backend).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd

from bench.harness.ceilings import Ceilings
from bench.harness.passes import PASSES, dtype_of
from bench.harness.provenance import ROW_FIELDS
from glai_kernels import registry
from glai_kernels.contract import Shape

KEY_COLUMNS: tuple[str, ...] = ("backend", "batch", "inputs", "paths", "outputs", "dtype",
                                "pass", "device", "sweep", "head", "mu")
MEASURE_COLUMNS: tuple[str, ...] = (
    "status", "correct", "winner", "median_s", "q25_s", "q75_s", "iqr_s", "min_s", "samples",
    "calls", "first_call_s", "flops", "bytes", "gflops", "gbps", "intensity", "floor_s",
    "roofline_pct", "bound", "speedup_vs_baseline", "speedup_best", "vs_best_peer",
    "error_ratio", "peak_mem_bytes",
    "est_mem_bytes", "energy_j", "power_w", "energy_window_s", "measure_s", "note", "nnz",
)
COLUMNS: tuple[str, ...] = KEY_COLUMNS + MEASURE_COLUMNS + ROW_FIELDS
# one measurement, whichever sweeps report it; `mu` (the kept fraction) is empty except in
# the kept-fraction sweep (bench/harness/kept.py), whose rows are at a paper head's shape too
MEASUREMENT_KEY = ["backend", "batch", "inputs", "paths", "outputs", "dtype", "pass", "device",
                   "mu"]
# what the backends of one run are compared over (speedups, the winner)
COMPARISON_KEY = ["batch", "inputs", "paths", "outputs", "dtype", "pass", "device", "mu"]
# each row's median over the best peer's (bench/harness/peers.py)
PEER_COLUMN = "vs_best_peer"
# stands for an empty `mu` in grouping keys (pandas drops NaN keys and NaN != NaN)
NO_MU = -1.0


def _keyed(df: pd.DataFrame) -> pd.DataFrame:
    """df[COMPARISON_KEY] with an empty mu as NO_MU, so the key groups and compares."""
    keys = df[COMPARISON_KEY].copy()
    keys["mu"] = pd.to_numeric(keys["mu"], errors="coerce").fillna(NO_MU)
    return keys


def _costs(row: pd.Series, ceilings: Ceilings) -> pd.Series:
    """FLOPs and bytes floor from the contract (a row that carries its own, as the
    kept-fraction sweep's do, keeps them; a pass without a cost model has none), and the
    roofline floor under `ceilings`."""
    flops, nbytes = row.get("flops"), row.get("bytes")
    if pd.isna(flops) or pd.isna(nbytes):
        if row["pass"] not in PASSES or pd.notna(row.get("mu")):
            return pd.Series({"flops": math.nan, "bytes": math.nan, "intensity": math.nan,
                              "floor_s": math.nan, "bound": None})
        shape = Shape(int(row["batch"]), int(row["inputs"]), int(row["paths"]),
                      int(row["outputs"]))
        spec = PASSES[row["pass"]]
        itemsize = dtype_of(row["dtype"]).itemsize
        flops, nbytes = spec.flops(shape), spec.min_bytes(shape, itemsize)
    return pd.Series({"flops": flops, "bytes": nbytes, "intensity": flops / nbytes,
                      "floor_s": ceilings.floor_s(flops, nbytes, row["dtype"]),
                      "bound": ceilings.bound(flops, nbytes, row["dtype"])})


def table(rows: list[dict], ceilings: Ceilings, provenance: dict,
          baseline: str | None = None) -> pd.DataFrame:
    """The full results table, every column of COLUMNS, in that order; speedups are over
    the backend `baseline` (default: the registry's baseline backend)."""
    baseline = baseline or registry.baseline().name
    df = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in df:
            df[col] = math.nan
    if df.empty:
        return df[list(COLUMNS)]
    df[["flops", "bytes", "intensity", "floor_s", "bound"]] = df.apply(
        _costs, axis=1, ceilings=ceilings)
    timed = df["status"].isin(["ok", "wrong"])
    df["gflops"] = (df["flops"] / df["median_s"] / 1e9).where(timed)
    df["gbps"] = (df["bytes"] / df["median_s"] / 1e9).where(timed)
    df["roofline_pct"] = (100 * df["floor_s"] / df["median_s"]).where(timed)
    df["speedup_vs_baseline"] = _speedup(df, "median_s", baseline).where(timed)
    df["speedup_best"] = _speedup(df, "min_s", baseline).where(timed)
    df[PEER_COLUMN] = best_peer_ratio(df).where(timed)
    df["winner"] = _winners(df)
    for name in ROW_FIELDS:
        df[name] = provenance.get(name, "")
    df["correct"] = df["correct"].astype("boolean")
    return df[list(COLUMNS)]


def _speedup(df: pd.DataFrame, column: str, backend: str) -> pd.Series:
    """The baseline `backend`'s `column` over each row's, for the same shape, dtype and pass."""
    keys = _keyed(df)
    ok = (df["backend"] == backend) & (df["status"] == "ok")
    baseline = dict(zip(map(tuple, keys[ok].to_numpy().tolist()), df.loc[ok, column],
                        strict=True))
    base = [baseline.get(k) for k in map(tuple, keys.to_numpy().tolist())]
    return pd.Series(base, index=df.index, dtype=float) / df[column]


def best_peer_ratio(df: pd.DataFrame) -> pd.Series:
    """The best peer's median over each row's, for the same shape, dtype and pass: the
    fastest correct median among the peers (`bench.harness.peers.is_peer_or_backend_peer`); NaN
    where no peer was measured correct."""
    from bench.harness.peers import is_peer_or_backend_peer

    keys = _keyed(df)
    ok = (df["backend"].map(is_peer_or_backend_peer) & (df["status"] == "ok")
          & (df["correct"] == True))  # noqa: E712
    best = (keys[ok].assign(median_s=df.loc[ok, "median_s"])
            .groupby(COMPARISON_KEY)["median_s"].min())
    base = [best.get(k) for k in map(tuple, keys.to_numpy().tolist())]
    return pd.Series(base, index=df.index, dtype=float) / df["median_s"]


def _winners(df: pd.DataFrame) -> pd.Series:
    """True for the fastest correct backend of each (shape, dtype, pass, mu)."""
    keyed = _keyed(df).assign(backend=df["backend"], median_s=df["median_s"])
    # the MLP a GLAI head replaces (bench/harness/kept.py) computes another function: never a
    # winner and a bench-only peer (bench/harness/peers.py) is what a user would write instead,
    # not a backend
    from bench.harness.peers import is_peer

    eligible = keyed[(df["status"] == "ok") & (df["correct"] == True)  # noqa: E712
                     & (df["backend"] != "mlp") & ~df["backend"].map(is_peer)]
    fastest = eligible.loc[eligible.groupby(COMPARISON_KEY)["median_s"].idxmin()]
    keys = ["backend", *COMPARISON_KEY]
    wins = set(map(tuple, fastest[keys].to_numpy().tolist()))
    return pd.Series([tuple(r) in wins for r in keyed[keys].to_numpy().tolist()],
                     index=df.index)


def write(df: pd.DataFrame, out_dir: Path, meta: dict) -> tuple[Path, Path]:
    """results.csv (every column) and results.json (meta once, rows without the repeated
    provenance columns), each replaced in one rename: a run killed while writing (the suite
    writes them after each shape) leaves the previous whole file, never half of one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / "results.csv", out_dir / "results.json"
    partial = csv_path.with_name(".results.csv.partial")
    df.to_csv(partial, index=False, float_format="%.6g")
    os.replace(partial, csv_path)
    slim = df.drop(columns=list(ROW_FIELDS))
    records = json.loads(slim.to_json(orient="records", double_precision=6))
    partial = json_path.with_name(".results.json.partial")
    partial.write_text(json.dumps({**meta, "columns": list(COLUMNS), "rows": records},
                                  indent=1, default=str) + "\n")
    os.replace(partial, json_path)
    return csv_path, json_path
