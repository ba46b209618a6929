"""`glai-bench render DIR` (or `python -m bench.reporting.render DIR`): redraw the charts and
summary.md of a finished run from its results.csv and results.json, without measuring anything
again.

The files are checked first (`merge.load`: a folder that is not a finished run is refused,
naming the file), the charts are drawn into a staging folder and the summary composed before
anything in DIR is replaced, so a failed render leaves the run's earlier report as it was."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench.cli_types import existing_dir
from bench.reporting import merge, plots, summary
from bench.reporting.history import write_atomic


def render(out_dir: Path) -> list[Path]:
    """Charts and summary for the run in `out_dir`; returns the paths written. ValueError
    naming the file when `out_dir` does not hold a finished run."""
    table, meta = merge.load(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".staging-", dir=out_dir) as tmp:
        staged = plots.write_all(table, meta, Path(tmp) / "plots")
        # the summary lists every chart in plots/, as summary.write does: the redrawn ones and
        # any others kept there
        others = {p.name for p in (out_dir / "plots").glob("*.png") if p.name not in plots.CHARTS}
        text = summary.render(table, meta, sorted({p.name for p in staged} | others))
        written = merge.publish(Path(tmp), staged, out_dir, charts=True)
    path = out_dir / "summary.md"
    write_atomic(path, text)
    return [*written, path]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="glai-bench render", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=existing_dir, help="a folder written by glai-bench run")
    args = p.parse_args(argv)
    try:
        written = render(args.out_dir)
    except ValueError as e:  # not a finished run's folder
        print(f"glai-bench render: error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
