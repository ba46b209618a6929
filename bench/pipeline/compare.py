"""Do two pipeline runs agree? `python -m bench.pipeline.compare A/results.json B/results.json`
(or the runs' folders, A B).

Compares the headline speedup (GLAI's time to convergence over the MLP's, mean over seeds)
per (data, head) and GLAI row of two runs' results.json, e.g. two runs of one commit, one of
them with other work on the machine. Prints a table and whether every head agrees within the
tolerance (default 15%: |a − b| / min(a, b) <= 0.15); the exit status is 1 when one does not.
The epochs per seed must match too (training is deterministic): a mismatch is reported, as
it means the runs did not train the same models. Beside it, per row, the components of the
headline in both runs (`components`): the MLP's and the model's least-disturbed cost per
epoch, their ratio, and GLAI's conversion time, each with its relative difference, to find
which one moved when a head disagrees. `--protocol engineered` compares the engineered
protocol's prices instead of the paper protocol's (the headline; bench/pipeline/report.py).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import pandas as pd

from bench.pipeline.report import _frame, protocol_records


def _results(path: pathlib.Path) -> list[dict]:
    """The records of a run's results.json (`path` the file or the run's folder); a missing
    or unreadable file raises ValueError naming it."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "results.json"
    try:
        return json.loads(path.read_text())["records"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a pipeline run's results.json "
                         f"({type(e).__name__}: {e})") from None


def _priced(path: pathlib.Path, protocol: str) -> pd.DataFrame:
    records = protocol_records(_results(path), protocol)
    if not records:
        raise ValueError(f"{path} has no {protocol} protocol's costs (an older run?)")
    return _frame(records)


def headline(path: pathlib.Path, protocol: str = "paper") -> pd.DataFrame:
    """Per (data, head, model) of the GLAI rows: mean headline, robust wall, raw wall and raw
    CPU speedup and the epochs per seed (a tuple), from one results.json, as `protocol`
    prices them."""
    frame = _priced(path, protocol)
    glai = frame[frame.model.str.startswith("GLAI")]
    return glai.groupby(["data", "head", "model"], sort=False).agg(
        speedup=("speedup", "mean"), robust_wall=("robust_wall_speedup", "mean"),
        wall=("wall_speedup", "mean"), cpu=("cpu_speedup", "mean"),
        epochs=("epochs_total", tuple))


def _components(path: pathlib.Path, protocol: str = "paper") -> pd.DataFrame:
    frame = _priced(path, protocol)
    frame["mlp_cost"] = frame["epoch_cost"] / frame["cost_ratio"]
    glai = frame[frame.model.str.startswith("GLAI")]
    return glai.groupby(["data", "head", "model"], sort=False).agg(
        mlp_cost=("mlp_cost", "mean"), model_cost=("epoch_cost", "mean"),
        cost_ratio=("cost_ratio", "mean"), convert=("t_convert", "mean"))


def components(a: pathlib.Path, b: pathlib.Path, protocol: str = "paper") -> pd.DataFrame:
    """Per (data, head, GLAI row) in both runs: the headline's components (mean over seeds)
    in run A, run B and their relative difference |a − b| / min(a, b)."""
    left, right = _components(a, protocol), _components(b, protocol)
    both = left.add_suffix(" A").join(right.add_suffix(" B"), how="inner")
    for measure in left.columns:
        x, y = both[f"{measure} A"], both[f"{measure} B"]
        both[f"{measure} diff"] = (x - y).abs() / pd.concat([x, y], axis=1).min(axis=1)
    return both


def compare(a: pathlib.Path, b: pathlib.Path, tolerance: float = 0.15,
            protocol: str = "paper") -> pd.DataFrame:
    """One row per (data, head, model) in both runs, with each measure's relative difference
    (|a − b| / min(a, b)), whether the headline agrees and whether the epochs match."""
    left, right = headline(a, protocol), headline(b, protocol)
    both = left.add_suffix(" A").join(right.add_suffix(" B"), how="inner")
    for measure in ("speedup", "robust_wall", "wall", "cpu"):
        x, y = both[f"{measure} A"], both[f"{measure} B"]
        both[f"{measure} diff"] = (x - y).abs() / pd.concat([x, y], axis=1).min(axis=1)
    both["agrees"] = both["speedup diff"] <= tolerance
    both["same epochs"] = both["epochs A"] == both["epochs B"]
    return both


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline.compare",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("a", type=pathlib.Path)
    parser.add_argument("b", type=pathlib.Path)
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--protocol", choices=("paper", "engineered"), default="paper")
    args = parser.parse_args(argv)
    try:
        table = compare(args.a, args.b, args.tolerance, args.protocol)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if table.empty:
        print("no (data, head, GLAI row) in common")
        return 1
    shown = table[["speedup A", "speedup B", "speedup diff", "robust_wall diff", "wall diff",
                   "cpu diff", "agrees", "same epochs"]]
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(shown.to_string())
        parts = components(args.a, args.b, args.protocol)
        print("\ncomponents (seconds on the headline clock, mean over seeds):")
        print(parts[[f"{m} {k}" for m in ("mlp_cost", "model_cost", "cost_ratio", "convert")
                     for k in ("A", "B", "diff")]].to_string())
    ok = bool(table.agrees.all())
    print(f"\nheadline speedups agree within {100 * args.tolerance:.0f}% on "
          f"{int(table.agrees.sum())} of {len(table)}: {'PASS' if ok else 'FAIL'}"
          + ("" if table["same epochs"].all() else
             "; WARNING: epochs differ between the runs (not the same training)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
