"""`glai-bench merge OUT RUN [RUN ...]`: several runs of one machine kind as one report.

A short GPU lease fits the heads sweep only in pieces (one dtype or batch range per call);
each piece is a complete run folder (results.csv, results.json). Merged, the rows are kept
as measured (each row's floor and share come from the ceilings of its own run), the
ceilings reported are the best of the runs', and the dispatch table and its within-5% counts
are built again over all the cases together, as one run would have.

    glai-bench merge reports/bench/cuda /tmp/f32 /tmp/bf16 --install-dispatch
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from bench.ceilings import Ceilings
from bench.suite import write_reports

# what makes two rows the same measurement
ROW_KEY = ["backend", "dtype", "pass", "batch", "inputs", "paths", "outputs", "sweep", "mu"]


def load(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    """(results table, meta without its rows) of one finished run."""
    meta = json.loads((run_dir / "results.json").read_text())
    meta.pop("rows", None)
    meta.pop("columns", None)
    return pd.read_csv(run_dir / "results.csv"), meta


def _best_ceilings(ceilings: list[dict]) -> dict:
    """Each ceiling at the highest rate any run measured (a ceiling is the best seen), over
    the union of the runs' dtypes."""
    best = Ceilings(**ceilings[0])
    for other in ceilings[1:]:
        best = best.best_of(Ceilings(**other))
    return best.as_dict()


def merge(runs: list[tuple[pd.DataFrame, dict]]) -> tuple[pd.DataFrame, dict]:
    """One (table, meta) from runs of one machine kind; raises ValueError for runs of
    different machines or a measurement present in two runs."""
    if not runs:
        raise ValueError("merge: give at least one run folder")
    machines = {m["provenance"].get("machine") for _, m in runs}
    if len(machines) != 1:
        raise ValueError(f"merge: runs must come from one machine kind, got {sorted(machines)}")
    table = pd.concat([df for df, _ in runs], ignore_index=True)
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
    p.add_argument("runs", type=Path, nargs="+", help="run folders written by glai-bench run")
    p.add_argument("--install-dispatch", action="store_true",
                   help="copy the merged dispatch table into glai_kernels/dispatch/")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    table, meta = merge([load(r) for r in args.runs])
    for path in write(table, meta, args.out_dir, args.install_dispatch, not args.no_plots):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
