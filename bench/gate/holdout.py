"""How often the regression gate cries wolf, and how often it catches a planted slowdown,
estimated from a baseline's own runs of unchanged code.

Hold out k of the N runs, build a baseline from the rest (same margin and floors), and judge
the held-out runs as `bench.gate.check` does: the first run alone, then each ratio's best over
the first two, the first three. Unchanged, any failure is a false alarm. Planted, the held-out
runs' ratios are moved as a backend `factor` times slower would move them (its speedups and
roofline shares divided by `factor`; for the oracle, the registry's baseline backend, every
other speedup multiplied and its own share divided), and a pass is a miss.

    glai-bench holdout [reports/baseline/<machine>.json] [--hold 3] [--factor 1.2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys

import pandas as pd

from bench import gate
from bench.cli_types import existing_file, positive_float, positive_int
from bench.gate.store import check_baseline


def planted(table: pd.DataFrame, backend: str, factor: float) -> pd.DataFrame:
    """One run's `ratios` table as it would read with `backend` `factor` times slower."""
    out = table.copy()
    mine = out["backend"] == backend
    if backend == gate.oracle_name():
        out.loc[~mine & (out["metric"] == "speedup_best"), "value"] *= factor
        out.loc[mine, "value"] /= factor
    else:
        out.loc[mine, "value"] /= factor
    return out


def holdout(baseline: dict, *, hold: int = 3, factor: float = 1.2, max_splits: int = 60,
            seed: int = 0) -> pd.DataFrame:
    """One row per (split, runs judged, scenario): `failed` is the gate's verdict. Scenario
    "unchanged" or a backend's name (planted `factor`× slower)."""
    tables = gate.run_tables(baseline)
    if len(tables) - hold < 3:
        raise ValueError(f"hold: leaves {len(tables) - hold} runs for the baseline; it needs 3")
    splits = list(itertools.combinations(range(len(tables)), hold))
    random.Random(seed).shuffle(splits)
    options = {k: baseline[k] for k in ("margin", "case_floor", "group_floor")}
    backends = sorted({b for t in tables for b in t["backend"]})
    rows = []
    for split in splits[:max_splits]:
        kept = [t for i, t in enumerate(tables) if i not in split]
        trial = {**baseline, **gate.thresholds_from(kept, **options)}
        held = [tables[i] for i in split]
        for scenario in ["unchanged", *backends]:
            runs = held if scenario == "unchanged" else [planted(t, scenario, factor)
                                                         for t in held]
            for k in range(1, hold + 1):
                verdict = gate.compare_ratios(gate.best_value(runs[:k]), trial)
                rows.append({"split": split, "runs": k, "scenario": scenario,
                             "failed": not verdict.ok})
    return pd.DataFrame(rows)


def summary(trials: pd.DataFrame, factor: float) -> str:
    """Markdown: false alarms (unchanged) and detections (planted) per number of runs."""
    rate = trials.groupby(["scenario", "runs"])["failed"].agg(["sum", "size"]).reset_index()
    runs = sorted(rate["runs"].unique())
    lines = ["| scenario | " + " | ".join(
                 f"{'first run' if k == 1 else f'best of {k}'}" for k in runs) + " |",
             "|---|" + "---|" * len(runs)]
    order = ["unchanged", *sorted(s for s in rate["scenario"].unique() if s != "unchanged")]
    for scenario in order:
        sub = rate[rate["scenario"] == scenario].set_index("runs")
        what = ("unchanged: false alarms" if scenario == "unchanged"
                else f"{scenario} {factor}× slower: caught")
        lines.append(f"| {what} | " + " | ".join(
            f"{int(sub.loc[k, 'sum'])}/{int(sub.loc[k, 'size'])}" for k in runs) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="glai-bench holdout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("baseline", type=existing_file, nargs="?",
                   help="a baseline JSON (default: this machine kind's, if committed)")
    p.add_argument("--hold", type=positive_int, default=3,
                   help="runs held out per split (default 3)")
    p.add_argument("--factor", type=positive_float, default=1.2,
                   help="planted slowdown (default 1.2)")
    p.add_argument("--splits", type=positive_int, default=60, help="splits to try (default 60)")
    args = p.parse_args(argv)
    if args.baseline is None:
        import torch

        from bench.harness.provenance import collect

        args.baseline = gate.baseline_path(gate.machine_kind(collect(torch.device("cpu"))))
        if not args.baseline.is_file():
            p.error(f"no committed baseline for this machine kind ({args.baseline}); name one")
    try:
        baseline = json.loads(args.baseline.read_text())
        if not isinstance(baseline, dict):
            raise ValueError("not a JSON object")
        check_baseline(baseline)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        print(f"{p.prog}: error: {args.baseline}: not a usable baseline ({e})", file=sys.stderr)
        return 2
    if args.hold >= baseline["n_runs"]:
        p.error(f"argument --hold: {args.hold} leaves no run of the baseline's "
                f"{baseline['n_runs']} to build from")
    trials = holdout(baseline, hold=args.hold, factor=args.factor, max_splits=args.splits)
    print(f"{args.baseline}: {baseline['n_runs']} runs; {trials['split'].nunique()} splits "
          f"holding out {args.hold}")
    print(summary(trials, args.factor))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
