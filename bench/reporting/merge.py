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

Shards of one run (`glai-bench run --shard K/N`, or under a SLURM job array or torchrun:
bench/harness/shards.py) hold disjoint cases, so they merge as pieces do, into the report and
dispatch table the unsharded run would have written; a shard missing from the folders given
is named in a warning and in the merged results.json. Pipeline shards (folders holding a
pipeline results.json) are joined by `--pipeline` (bench/pipeline/merge.py), detected when
every folder given is one:

    glai-bench merge reports/bench/cuda /scratch/bench/shard-*-of-4
    glai-bench merge --pipeline reports/pipeline /scratch/pipeline/shard-*-of-4
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd

from bench.cli_types import existing_dir, output_dir
from bench.harness import shards as shards_mod
from bench.harness.ceilings import Ceilings
from bench.harness.results import COLUMNS, KEY_COLUMNS, MEASURE_COLUMNS
from bench.harness.suite import write_reports
from bench.reporting.history import read_json_object

# what makes two rows the same measurement
ROW_KEY = ["backend", "dtype", "pass", "batch", "inputs", "paths", "outputs", "sweep", "mu"]
# the results table's columns that hold text or flags; every other key or measure is a number
TEXT_COLUMNS = ("backend", "dtype", "pass", "device", "sweep", "head", "status", "correct",
                "winner", "bound", "note")
# what the reports read of a results.json (summary.md, the charts' subtitles, the dispatch
# table): field -> (accepted types, what the message says it should be)
_TEXT, _NUMBER = (str, "a string"), ((int, float), "a number")
META_FIELDS = {"provenance": (dict, "an object"), "preset": (dict, "an object"),
               "ceilings": (dict, "an object"), "backends": (list, "a list"),
               "unavailable": (dict, "an object"), "elapsed_s": _NUMBER,
               "memory_method": _TEXT, "energy": _TEXT}
PROVENANCE_FIELDS = {**dict.fromkeys(("machine", "device", "device_name", "commit", "date",
                                      "torch_version"), _TEXT), "threads": (int, "an integer")}
PRESET_FIELDS = {"name": _TEXT, "description": _TEXT, "dtypes": (list, "a list")}


def load(run: Path | str) -> tuple[pd.DataFrame, dict]:
    """(results table, meta without its rows) of one finished run; `DIR:b1,b2` keeps only
    those backends' rows (and says so in the meta's command). ValueError naming the file
    when the folder is not a finished run (`read_meta`, `read_table`)."""
    run_dir, _, keep = str(run).partition(":")
    meta = read_meta(Path(run_dir) / "results.json")
    meta.pop("rows", None)
    meta.pop("columns", None)
    table = read_table(Path(run_dir) / "results.csv")
    if keep:
        backends = keep.split(",")
        unknown = sorted(set(backends) - set(table["backend"]))
        if unknown:
            raise ValueError(f"merge: {run_dir} has no rows of backend(s) {unknown}")
        table = table[table["backend"].isin(backends)].reset_index(drop=True)
        meta["command"] = f"{meta.get('command', '')} (rows of {keep} only)"
        meta["backends"] = [b for b in meta.get("backends", []) if b in backends]
    return table, meta


def read_meta(path: Path) -> dict:
    """A run's results.json, checked for what the reports read of it (the provenance's
    machine and device, the ceilings); ValueError naming `path` otherwise."""
    meta = read_json_object(path, "results file")
    wrong = [f"{k} is {_type_name(meta.get(k))}, expected {what}"
             for k, (kind, what) in META_FIELDS.items() if not isinstance(meta.get(k), kind)]
    wrong += [f"{part}.{k} is {_type_name(meta[part].get(k))}, expected {what}"
              for part, fields in (("provenance", PROVENANCE_FIELDS), ("preset", PRESET_FIELDS))
              if isinstance(meta.get(part), dict)
              for k, (kind, what) in fields.items() if not isinstance(meta[part].get(k), kind)]
    if not isinstance(meta.get("dispatch") or {}, dict):
        wrong.append(f"dispatch is {_type_name(meta['dispatch'])}, expected an object")
    if wrong:
        raise ValueError(f"{path}: not a results.json of this suite: {'; '.join(wrong)}")
    try:
        Ceilings(**meta["ceilings"])
    except TypeError as e:
        raise ValueError(f"{path}: the ceilings are malformed ({e})") from None
    return meta


def _type_name(value: object) -> str:
    return "missing" if value is None else type(value).__name__




def read_table(path: Path) -> pd.DataFrame:
    """A run's results.csv, checked for every column a run writes (`results.COLUMNS`), each
    numeric one numeric; ValueError naming `path` otherwise."""
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as e:  # pandas' ParserError and EmptyDataError are ValueErrors
        raise ValueError(f"{path}: not a readable results.csv ({e})") from None
    lacking = [c for c in COLUMNS if c not in table.columns]
    if lacking:
        raise ValueError(f"{path}: not a results.csv of this suite: no column(s) "
                         f"{', '.join(lacking)}")
    not_numbers = [c for c in (*KEY_COLUMNS, *MEASURE_COLUMNS) if c not in TEXT_COLUMNS
                   and not pd.api.types.is_numeric_dtype(table[c])]
    if not_numbers:
        raise ValueError(f"{path}: column(s) {', '.join(not_numbers)} hold something other "
                         f"than numbers")
    return table


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
    meta["provenance"] = {k: v for k, v in first["provenance"].items() if k != "shard"}
    shards = [m["provenance"]["shard"] for _, m in runs if m["provenance"].get("shard")]
    for entry, (_, m) in zip(meta["merged_from"], runs, strict=True):
        if m["provenance"].get("shard"):
            entry["shard"] = m["provenance"]["shard"]
    if shards:
        meta["shards"] = shards_mod.coverage(shards)
    return table, meta


def coverage_warning(meta: dict) -> str | None:
    """A line for the terminal when the merged shards do not make one whole run."""
    cover = meta.get("shards")
    if not cover:
        return None
    problems = []
    if cover["missing"]:
        problems.append(f"shard(s) {', '.join(map(str, cover['missing']))} of "
                        f"{cover['count']} missing: their cases are not in the report")
    if cover.get("counts_differ"):
        problems.append(f"shards of splits into {cover['counts_differ']} parts mixed")
    return "warning: " + "; ".join(problems) if problems else None


def write(table: pd.DataFrame, meta: dict, out_dir: Path, install: bool = False,
          plots: bool = True) -> list[Path]:
    """The merged run's files in `out_dir`, as a run writes them (`suite.write_reports`), its
    dispatch table for the runs' machine kind.

    They are written into a staging folder inside `out_dir` first and moved into place only
    when all of them were written (`publish`), so a failure leaves an earlier report there
    as it was; the dispatch table is installed (`install`) only after that."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".staging-", dir=out_dir) as tmp:
        staged = write_reports(table, meta, Path(tmp), False, plots, meta.get("machine_kind"))
        written = publish(Path(tmp), staged, out_dir, charts=plots)
    if install and meta.get("dispatch"):
        from bench.harness import dispatch_table, results

        installed = dispatch_table.install(out_dir / meta["dispatch"]["file"])
        meta["dispatch"]["installed"] = str(installed.relative_to(installed.parents[2]))
        results.write(table, out_dir, meta)  # the run's files say where the table went
        written.append(installed)
    from bench.reporting import summary

    # again in place: without plots the summary lists the charts already in out_dir/plots
    summary.write(table, meta, out_dir)
    return written


def publish(staging: Path, files: list[Path], out_dir: Path, charts: bool) -> list[Path]:
    """Move `files` (under `staging`) to the same place under `out_dir`, each with one atomic
    rename; with `charts`, drop out_dir's charts that the staged run did not draw, as
    `plots.write_all` does (a stale chart would mislead). Returns the new paths."""
    from bench.reporting import plots as plots_mod

    moved = []
    for path in files:
        target = out_dir / path.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        moved.append(target)
    if charts:
        for name in plots_mod.CHARTS:
            stale = out_dir / "plots" / name
            if stale not in moved and stale.exists():
                stale.unlink()
    return moved


def run_folder(text: str) -> str:
    """argparse type of a RUN argument: `DIR` or `DIR:b1,b2`, DIR an existing folder."""
    existing_dir(text.partition(":")[0])
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="glai-bench merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=output_dir, help="where the merged report goes")
    p.add_argument("runs", nargs="+", type=run_folder,
                   help="run folders written by glai-bench run (DIR:b1,b2: those backends' rows)")
    p.add_argument("--install-dispatch", action="store_true",
                   help="copy the merged dispatch table into glai_kernels/dispatch/")
    p.add_argument("--repeats", action="store_true",
                   help="runs that repeat measurements: keep each one's median run's row")
    p.add_argument("--pipeline", action="store_true",
                   help="the folders are GLAI pipeline runs (or shards): join their records "
                        "into one pipeline report (detected when every folder is one)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    from bench.pipeline import merge as pipeline_merge

    if args.pipeline or all(pipeline_merge.is_pipeline_run(r) for r in args.runs):
        if args.install_dispatch or args.repeats:
            p.error("--install-dispatch and --repeats are for kernel runs, not --pipeline")
        return pipeline_merge.main_merge(args.out_dir, args.runs)
    try:
        table, meta = merge([load(r) for r in args.runs], repeats=args.repeats)
    except ValueError as e:  # a folder that is not a finished run, runs that do not fit
        print(f"glai-bench merge: error: {e}", file=sys.stderr)
        return 2
    warning = coverage_warning(meta)
    if warning:
        print(f"glai-bench merge: {warning}", file=sys.stderr)
    for path in write(table, meta, args.out_dir, args.install_dispatch, not args.no_plots):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
