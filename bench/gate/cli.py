"""`python -m bench.gate check|accept|measure` (also `glai-bench gate ...`).

`check` measures this checkout against a base commit on this machine (`bench.gate.paired`),
with `--baseline` also against the committed baseline for this machine kind; `check
--results FILE` compares a results.json with the committed baseline only. Exit codes: 0 pass,
1 a regression, 2 bad usage or nothing measured or compared."""

from __future__ import annotations

import argparse
import sys

import bench.gate
from bench.cli_types import (
    at_least,
    existing_file,
    non_negative_float,
    non_negative_int,
    output_dir,
    output_file,
    positive_float,
)
from bench.gate.measuring import check, measure, measure_fresh, save_run
from bench.gate.paired import versus
from bench.gate.planted import from_spec
from bench.gate.reporting import report, spread_summary
from bench.gate.stats import best_of, compare_ratios
from bench.gate.store import BASELINE_DIR, accept, load_baseline, machine_kind, read_results
from bench.harness.sweeps import PRESETS
from glai_kernels import registry

# a baseline's spread needs at least this many runs (`bench.gate.store.build_baseline`)
MIN_RUNS = 3


def plant_spec(text: str) -> str:
    """`--plant BACKEND=FACTOR`: a registered backend and a slowdown above 1, checked here
    (`check` plants it in fresh processes, whose failure would say much less)."""
    name, sep, factor = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected BACKEND=FACTOR (e.g. torch=1.25), "
                                         f"got {text!r}")
    try:
        registry.get(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    try:
        slowdown = float(factor)
    except ValueError:
        slowdown = float("nan")
    if not slowdown > 1:  # `not >` also refuses NaN
        raise argparse.ArgumentTypeError(f"FACTOR must be a slowdown above 1, got {text!r}")
    return text


def parser(prog: str = "glai-bench gate") -> argparse.ArgumentParser:
    """The gate's command line: subcommands check, accept and measure."""
    p = argparse.ArgumentParser(prog=prog, description=bench.gate.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="measure this checkout against a base commit, "
                                     "interleaved, and compare their same-run ratios")
    c.add_argument("--results", type=existing_file,
                   help="compare this results.json with the committed baseline instead of "
                        "measuring")
    c.add_argument("--base", metavar="REV",
                   help="the commit to compare with (default: the merge base with main, or "
                        "HEAD~1 on main)")
    c.add_argument("--pairs", type=at_least(2), default=2,
                   help="interleaved (base, candidate) runs, each a fresh process (default 2)")
    c.add_argument("--jobs", type=int, choices=(1, 2), default=2,
                   help="2: each pair's base and candidate side by side, one per core "
                        "(default); 1: one after the other")
    c.add_argument("--baseline", action="store_true",
                   help="also compare the candidate's runs with the committed baseline for "
                        "this machine kind, where one exists")
    c.add_argument("--confirm", type=non_negative_int, default=None,
                   help="re-measurements before a failure stands: one more pair each "
                        "(default 1); with --results, unused")
    c.add_argument("--save", type=output_dir, metavar="DIR",
                   help="keep each measured run's results as DIR/gate-run-N.json")
    a = sub.add_parser("accept", help="write a new baseline for this machine kind, on purpose")
    a.add_argument("--runs", type=at_least(MIN_RUNS), default=10,
                   help="runs of unchanged code, each in a fresh process (default 10)")
    a.add_argument("--results", type=existing_file, nargs="+",
                   help="build it from these results.json files instead of measuring")
    a.add_argument("--note", default="", help="why the baseline changed (kept in the file)")
    a.add_argument("--margin", type=positive_float, default=1.5)
    a.add_argument("--case-floor", type=non_negative_float, default=0.10)
    a.add_argument("--group-floor", type=non_negative_float, default=0.05)
    m = sub.add_parser("measure", help="one run in this process, written to --out (what "
                                       "check and accept start in a fresh process per run)")
    m.add_argument("--out", type=output_file, required=True)
    for sp in (c, m):
        sp.add_argument("--plant", metavar="BACKEND=FACTOR", type=plant_spec,
                        help="slow BACKEND down FACTOR times (e.g. torch=1.25) to see the "
                             "gate fail")
    for sp in (c, a, m):
        sp.add_argument("--preset", choices=sorted(PRESETS), default="quick")
        sp.add_argument("--device", choices=("cpu", "cuda"), default=None)
    for sp in (c, a):
        sp.add_argument("--baseline-dir", type=output_dir, default=BASELINE_DIR)
    return p


def main(argv: list[str] | None = None, prog: str = "glai-bench gate") -> int:
    p = parser(prog)
    args = p.parse_args(argv)
    if args.command == "check" and not args.baseline_dir.is_dir():
        # a mistyped folder would otherwise read as "no baseline yet": a pass comparing nothing
        p.error(f"argument --baseline-dir: no such folder: {args.baseline_dir}")
    if args.command == "accept" and args.results and len(args.results) < MIN_RUNS:
        p.error(f"argument --results: a baseline needs at least {MIN_RUNS} runs to measure "
                f"their spread, got {len(args.results)} file(s)")
    try:
        return _run(args)
    except ValueError as e:  # a bad results or baseline file, runs that do not fit together
        print(f"{prog} {args.command}: error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from bench.harness import onednn_guard

    reason = onednn_guard.apply()  # `python -m bench.gate` is a timing entry point of its own
    if reason:
        print(f"note: {reason}", file=sys.stderr)

    if args.command == "measure":
        if args.plant:
            print(f"planted: backend slowed, {args.plant}")
        with from_spec(args.plant):
            result = measure(args.preset, device=args.device)
        save_run(args.out, result)
        return 0
    if args.command == "check" and args.results:
        results = read_results(args.results)
        machine = machine_kind(results["provenance"])
        if load_baseline(machine, args.baseline_dir) is None:
            print(f"regression gate: no baseline for machine kind {machine!r} in "
                  f"{args.baseline_dir}; nothing compared", file=sys.stderr)
            return 2
        passed, text = check(results, baseline_dir=args.baseline_dir, confirm=0)
        print(text)
        return 0 if passed else 1
    if args.command == "check":
        return _check_paired(args)
    if args.results:
        runs = [read_results(f) for f in args.results]
    else:
        runs = []
        for i in range(args.runs):
            print(f"baseline run {i + 1} of {args.runs}, in a fresh process")
            runs.append(measure_fresh(args.preset, device=args.device))
    path, baseline = accept(runs, baseline_dir=args.baseline_dir, note=args.note,
                            margin=args.margin, case_floor=args.case_floor,
                            group_floor=args.group_floor)
    print(spread_summary(baseline))
    print(f"wrote {path}; commit it with a message saying why the baseline moved")
    return 0


def _check_paired(args: argparse.Namespace) -> int:
    """This checkout against a base commit (and, with --baseline, the committed baseline: a
    failure there earns the confirming pair too, and is judged on each ratio's best over all
    the candidate's runs, so a one-off slow minute of the shared machine is not a regression
    while a slowdown present in every run stays one)."""
    confirm = 1 if args.confirm is None else args.confirm

    def against_baseline(runs: list[dict]) -> tuple[bool, str]:
        machine = machine_kind(runs[0]["provenance"])
        baseline = load_baseline(machine, args.baseline_dir)
        if baseline is None:
            return True, f"no committed baseline for machine kind {machine!r}: that check skipped"
        verdict = compare_ratios(best_of(runs), baseline)
        return verdict.ok, report(verdict, baseline)

    passed, text, runs = versus(args.base, pairs=args.pairs, confirm=confirm, jobs=args.jobs,
                                preset=args.preset, device=args.device, plant=args.plant,
                                also=against_baseline if args.baseline else None)
    print(text)
    if args.save:
        for i, run in enumerate(runs, 1):
            save_run(args.save / f"gate-run-{i}.json", run)
    return 0 if passed else 1
