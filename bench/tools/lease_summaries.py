"""What the lease script (on_gpu.sh) prints into bench.log after its energy and triton steps:
a few lines read from the step's results.csv, or one saying there is none (the step's time
limit ended it before it wrote one).

    python -m bench.tools.lease_summaries energy /tmp/bench_cuda/energy/results.csv
    python -m bench.tools.lease_summaries triton /tmp/bench_cuda_triton

The triton summary also lists each kernel's tuning record kept in the folder's
triton-autotune/ (glai_kernels/triton_tuning.py). Reads files only; imports no torch.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of the results.csv at `path`, none where the step left no such file."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def heading(title: str, rows: list, path: Path, after: str = "") -> str:
    """`title` and `after` when there are rows, else `title` and why there are none."""
    return title + (after if rows else f": none, no {path} (the step ended before writing it)")


def energy_lines(path: Path) -> list[str]:
    """The energy step's readings: one line per row, "-" for a value it could not take."""
    rows = read_rows(path)
    lines = [heading("energy (NVML, windows of >= 1 s): head B pass backend median_us J/call W "
                     "window_s note", rows, path)]
    for r in rows:
        us = f"{float(r['median_s']) * 1e6:.1f}" if r["median_s"] else "-"
        lines.append(" ".join([" ", r["head"], r["batch"], r["pass"], r["backend"], us,
                               r["energy_j"] or "-", r["power_w"] or "-",
                               r["energy_window_s"] or "-", r["note"]]))
    return lines


def triton_lines(folder: Path) -> list[str]:
    """The triton step's first calls (tuning included) per row, then each kernel's tuning time
    per new shape from the tuning records copied into `folder`/triton-autotune/."""
    path = folder / "results.csv"
    rows = read_rows(path)
    lines = [heading("triton autotune s, each row's first call (the suite times the calls after "
                     "it)", rows, path, ":")]
    for r in rows:
        if r["backend"] == "triton" and r["first_call_s"]:
            median = f"{float(r['median_s']) * 1e6:.1f} us" if r["median_s"] else r["note"]
            lines.append(f"  {r['head']} B={r['batch']} {r['pass']}: "
                         f"{float(r['first_call_s']):.2f} s (then {median})")
    lines.append("triton autotune s, each kernel's tuning per new shape "
                 "(glai_kernels/triton_tuning.py):")
    for record in sorted((folder / "triton-autotune").glob("*.json")):
        d = json.loads(record.read_text())
        k = d["key"]
        lines.append(f"  {d['kernel']} B<={k['B']} I={k['I']} P={k['P']} O={k['O']} "
                     f"{k['precision']}: {d['tune_s']} s, {len(d['timings_s'])} configs timed, "
                     f"chose {d['config']}")
    return lines


SUMMARIES = {"energy": energy_lines, "triton": triton_lines}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in SUMMARIES:
        print(f"usage: python -m bench.tools.lease_summaries {{{','.join(SUMMARIES)}}} PATH",
              file=sys.stderr)
        return 2
    print("\n".join(SUMMARIES[args[0]](Path(args[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
