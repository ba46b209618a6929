"""The layout crossover table a run measures (glai_kernels/dispatch/crossover.py): the kept
fraction at or below which a pruned head's training step is faster in the sparse layout, for
the machine kind the run was on, from the kept-fraction sweep's `step` pass.

    build(df, meta, kind=None) -> the table dict, None when the run has no step pass
    write_for_run(df, meta, out_dir, install, kind)
        -> [out_dir/dispatch/<kind>.layout_crossover.json] (copied into glai_kernels/dispatch/
           with `install`), recorded in meta["layout_crossover"]

Per (head, batch), over the random masks (the matched μ is a pruned head, another structure:
bench/reporting/kept_report.py): the μ where the best sparse and the best dense step take the
same time, interpolated in log μ (`kept_report.crossover`); where sparse wins at every μ
measured, the largest μ measured (no claim beyond it); where dense wins at every μ, 0; where
they alternate, the largest μ up to which sparse wins at every μ. The table's crossover is the
smallest over the cases at the paper's training batches (B <= 32) when the run has any, else
over all: the layout choice must not lose at any head measured.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.harness import dispatch_table
from bench.reporting.kept_report import at_match, best_times, crossover, kept_rows
from glai_kernels import dispatch
from glai_kernels.dispatch import crossover as layout

TRAINING_BATCH_MAX = 32  # the paper's batches: 16, and 32 for C2
META_KEY = "layout_crossover"


def case_crossover(rows: pd.DataFrame) -> tuple[float, str] | None:
    """(the crossover, a phrase) of one head and batch's `step` rows over random masks, None
    when no μ has both a sparse and a dense time."""
    best = best_times(rows).dropna(subset=["sparse", "dense"])
    if best.empty:
        return None
    mu, phrase = crossover(rows)
    if mu is not None:
        return float(mu), phrase
    wins = list(best["sparse"] < best["dense"])
    mus = [float(m) for m in best.index]
    upto = 0.0
    for m, won in zip(mus, wins, strict=True):
        if not won:
            break
        upto = m
    return upto, phrase


def build(df: pd.DataFrame, meta: dict, kind: str | None = None) -> dict | None:
    """The layout crossover table of a run's results (module docstring), None without a
    kept-fraction `step` pass."""
    rows = kept_rows(df)
    if rows.empty:
        return None
    rows = rows[(rows["pass"] == "step") & ~at_match(rows)]
    cases = []
    for (head, batch), g in rows.groupby(["head", "batch"], sort=True):
        found = case_crossover(g)
        if found is not None:
            cases.append({"head": head, "batch": int(batch), "crossover": round(found[0], 6),
                          "phrase": found[1], "mus": sorted(float(m) for m in set(g["mu"]))})
    if not cases:
        return None
    training = [c for c in cases if c["batch"] <= TRAINING_BATCH_MAX] or cases
    prov = meta["provenance"]
    kind = kind or dispatch.machine_kind(prov["device"], threads=prov.get("threads"))
    return {"kind": layout.KIND, "schema": layout.SCHEMA, "machine_kind": kind,
            "crossover": min(c["crossover"] for c in training),
            "rule": "the smallest over the cases at B <= 32 (else all) of the kept fraction "
                    "where the best sparse step = the best dense step over random masks "
                    "(bench/harness/crossover_table.py)",
            "provenance": {"command": meta.get("command", ""), "commit": prov.get("commit", ""),
                           "date": prov.get("date", ""), "device_name": prov.get("device_name", ""),
                           "threads": prov.get("threads"),
                           "torch_version": prov.get("torch_version"),
                           "load_average": prov.get("load_average")},
            "cases": cases}


def write(table: dict, out_dir: Path) -> Path:
    return dispatch_table.write_json(table, layout.table_path(table["machine_kind"],
                                                              out_dir / "dispatch"))


install = dispatch_table.install  # the same folder, the same copy


def write_for_run(df: pd.DataFrame, meta: dict, out_dir: Path, install_table: bool = False,
                  kind: str | None = None) -> list[Path]:
    """The run's table in out_dir/dispatch/ (and the package with `install_table`), recorded
    in meta["layout_crossover"]; [] when the run has no kept-fraction step pass."""
    table = build(df, meta, kind)
    if table is None:
        return []
    path = write(table, out_dir)
    meta[META_KEY] = {"machine_kind": table["machine_kind"], "crossover": table["crossover"],
                      "file": f"dispatch/{path.name}"}
    written = [path]
    if install_table:
        installed = install(path)
        meta[META_KEY]["installed"] = str(installed.relative_to(installed.parents[2]))
        written.append(installed)
    return written

