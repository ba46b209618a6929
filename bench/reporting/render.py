"""`glai-bench render DIR` (or `python -m bench.reporting.render DIR`): redraw the charts and
summary.md of a finished run from its results.csv and results.json, without measuring anything
again."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from bench.reporting import plots, summary


def render(out_dir: Path) -> list[Path]:
    """Charts and summary for the run in `out_dir`; returns the paths written."""
    table = pd.read_csv(out_dir / "results.csv")
    meta = json.loads((out_dir / "results.json").read_text())
    meta.pop("rows", None)
    written = plots.write_all(table, meta, out_dir / "plots")
    written.append(summary.write(table, meta, out_dir))
    return written


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="glai-bench render", description=__doc__)
    p.add_argument("out_dir", type=Path, help="a folder written by python -m bench")
    for path in render(p.parse_args(argv).out_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
