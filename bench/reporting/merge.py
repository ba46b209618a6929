"""`glai-bench merge OUT RUN [RUN ...]`: several runs of one machine kind as one report.

A short GPU lease fits the heads sweep only in pieces (one dtype or batch range per call);
each piece is a complete run folder (results.csv, results.json). Merged, the rows are kept
as measured (each row's floor and share come from the ceilings of its own run), the
ceilings reported are the best of the runs', and the dispatch table and its within-5% counts
are built again over all the cases together, as one run would have.

    glai-bench merge reports/bench/cuda /tmp/f32 /tmp/bf16 --install-dispatch
    glai-bench merge reports/bench/cuda /tmp/f32 /tmp/triton:triton   # that run's triton rows

A shape one piece skipped at its time limit and another measured is kept as measured. A
measurement present in two runs is refused, unless `RUN:BACKENDS` keeps only some backends'
rows of a run (a run of one new backend that also timed the others beside it), or `--repeats`
asks for the same sweep taken several times to be combined: each measurement is then the
row of the run whose median is the median of the runs' (a wrong result in any run keeps the
measurement wrong), its note giving the runs' range. Each row's ratios stay those of its own
run, against backends timed beside it.

    glai-bench merge reports/bench/cuda /tmp/run1 /tmp/run2 /tmp/run3 --repeats
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from bench.harness.ceilings import Ceilings
from bench.harness.suite import write_reports

# what makes two rows the same measurement
ROW_KEY = ["backend", "dtype", "pass", "batch", "inputs", "paths", "outputs", "sweep", "mu"]


def load(run: Path | str) -> tuple[pd.DataFrame, dict]:
    """(results table, meta without its rows) of one finished run; `DIR:b1,b2` keeps only
    those backends' rows (and says so in the meta's command)."""
    run_dir, _, keep = str(run).partition(":")
    meta = json.loads((Path(run_dir) / "results.json").read_text())
    meta.pop("rows", None)
    meta.pop("columns", None)
    table = pd.read_csv(Path(run_dir) / "results.csv")
    if keep:
        backends = keep.split(",")
        unknown = sorted(set(backends) - set(table["backend"]))
        if unknown:
            raise ValueError(f"merge: {run_dir} has no rows of backend(s) {unknown}")
        table = table[table["backend"].isin(backends)].reset_index(drop=True)
        meta["command"] = f"{meta.get('command', '')} (rows of {keep} only)"
        meta["backends"] = [b for b in meta.get("backends", []) if b in backends]
    return table, meta


def _measured_over_skipped(table: pd.DataFrame) -> pd.DataFrame:
    """Drops each skipped row whose measurement another run took, and repeats of a skipped
    row: a time limit's placeholder is not a measurement."""
    skipped = table["status"] == "skipped"
    keys = table[ROW_KEY].map(str).agg("|".join, axis=1)
    drop = skipped & (keys.isin(set(keys[~skipped])) | keys.duplicated())
    return table[~drop].reset_index(drop=True)


def _best_ceilings(ceilings: list[dict]) -> dict:
    """Each ceiling at the highest rate any run measured (a ceiling is the best seen), over
    the union of the runs' dtypes."""
    best = Ceilings(**ceilings[0])
    for other in ceilings[1:]:
        best = best.best_of(Ceilings(**other))
    return best.as_dict()


def _median_of_repeats(table: pd.DataFrame) -> pd.DataFrame:
    """One row per measurement of repeated runs: the run's row whose median is the median of
    the runs' (the lower middle of an even count), or a wrong one if any run's was wrong."""
    table = table.copy()
    table["note"] = table["note"].astype(object)  # all empty reads back as floats
    timed = table["status"].isin(["ok", "wrong"])
    drop: list[int] = []
    for _, group in table[timed].groupby(ROW_KEY, dropna=False, sort=False):
        if len(group) == 1:
            continue
        ordered = group.sort_values("median_s", kind="stable")
        wrong = ordered[ordered["status"] == "wrong"]
        kept = wrong.index[0] if len(wrong) else ordered.index[(len(ordered) - 1) // 2]
        lo, hi = ordered["median_s"].min(), ordered["median_s"].max()
        note = f"median of {len(group)} runs' medians ({lo * 1e6:.4g}-{hi * 1e6:.4g} us)"
        old = table.at[kept, "note"]
        table.at[kept, "note"] = note if pd.isna(old) or not old else f"{old}; {note}"
        drop.extend(i for i in group.index if i != kept)
    return table.drop(index=drop).reset_index(drop=True)


def merge(runs: list[tuple[pd.DataFrame, dict]],
          repeats: bool = False) -> tuple[pd.DataFrame, dict]:
    """One (table, meta) from runs of one machine kind; raises ValueError for runs of
    different machines or a measurement present in two runs (unless `repeats`: then the
    median run's row)."""
    if not runs:
        raise ValueError("merge: give at least one run folder")
    machines = {m["provenance"].get("machine") for _, m in runs}
    if len(machines) != 1:
        raise ValueError(f"merge: runs must come from one machine kind, got {sorted(machines)}")
    table = _measured_over_skipped(pd.concat([df for df, _ in runs], ignore_index=True))
    if repeats:
        table = _median_of_repeats(table)
    twice = table[table.duplicated(subset=ROW_KEY)]
    if len(twice):
        example = ", ".join(f"{k}={twice.iloc[0][k]}" for k in ROW_KEY)
        raise ValueError(f"merge: {len(twice)} measurements appear in more than one run, "
                         f"e.g. {example}")
    first = runs[0][1]
    meta = {**first,
            "command": " ; ".join(m.get("command", "") for _, m in runs),
            "backends": list(dict.fromkeys(b for _, m in runs for b in m.get("backends", []))),
            "peers": list(dict.fromkeys(b for _, m in runs for b in m.get("peers", []))),
            "ceilings": _best_ceilings([m["ceilings"] for _, m in runs]),
            "elapsed_s": round(sum(m.get("elapsed_s", 0.0) for _, m in runs), 1),
            "merged_from": [{"command": m.get("command", ""),
                             "date": m["provenance"].get("date", ""),
                             "commit": m["provenance"].get("commit", ""),
                             "rows": len(df)} for df, m in runs]}
    meta["preset"] = {**first.get("preset", {}),
                      "dtypes": sorted({d for _, m in runs
                                        for d in m.get("preset", {}).get("dtypes", [])}),
                      "passes": sorted({p for _, m in runs
                                        for p in m.get("preset", {}).get("passes", [])})}
    kinds = {m["dispatch"]["machine_kind"] for _, m in runs if m.get("dispatch")}
    if len(kinds) > 1:
        raise ValueError(f"merge: the runs' dispatch tables name several machine kinds: "
                         f"{sorted(kinds)}")
    meta.pop("dispatch", None)
    meta.pop("sparse_dispatch", None)
    meta["machine_kind"] = kinds.pop() if kinds else None
    return table, meta


def write(table: pd.DataFrame, meta: dict, out_dir: Path, install: bool = False,
          plots: bool = True) -> list[Path]:
    """The merged run's files in `out_dir`, as a run writes them (`suite.write_reports`), its
    dispatch table for the runs' machine kind."""
    return write_reports(table, meta, out_dir, install, plots, meta.get("machine_kind"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="glai-bench merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=Path, help="where the merged report goes")
    p.add_argument("runs", nargs="+",
                   help="run folders written by glai-bench run (DIR:b1,b2: those backends' rows)")
    p.add_argument("--install-dispatch", action="store_true",
                   help="copy the merged dispatch table into glai_kernels/dispatch/")
    p.add_argument("--repeats", action="store_true",
                   help="runs that repeat measurements: keep each one's median run's row")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    table, meta = merge([load(r) for r in args.runs], repeats=args.repeats)
    for path in write(table, meta, args.out_dir, args.install_dispatch, not args.no_plots):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
