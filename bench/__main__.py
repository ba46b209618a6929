"""`glai-bench COMMAND [ARGS]` (or `python -m bench COMMAND [ARGS]`): the benchmarks' one
command line. `glai-bench COMMAND --help` describes each command; with no command, or with
options only, `run` is meant (`python -m bench --preset quick` is `glai-bench run --preset
quick`).

`run` (also `nox -s bench -- ARGS`): the kernel suite, then the GLAI pipeline, then the seconds
each phase took and the total.

    glai-bench run                                  # first-run preset, CUDA if present
    glai-bench run --preset long                    # the long sweeps (hours on 2 CPU cores)
    glai-bench run --preset quick --backends torch,compile --dtypes float32
    glai-bench run --suite kernels --device cpu --out /tmp/bench
    glai-bench run --suite kernels --sweeps heads --heads A1 --batches 256 --passes both
    glai-bench run --suite kernels --sweeps kept_fraction --heads A1,B1 --batches 16 \
        --backends cpp,sparse:torch                 # the sparse op against the dense one

The kernel suite writes results.csv, results.json, summary.md and plots/ into --out
(default reports/bench/<device>). The pipeline suite (bench/pipeline, when present) writes
into --pipeline-out (default reports/pipeline).

Past one machine: `--shard K/N` (or a SLURM job array's or torchrun's variables) runs shard K
of N into OUT/shard-K-of-N and PIPELINE_OUT/shard-K-of-N; `glai-bench merge` joins them.

    glai-bench run --suite kernels --shard 2/4 --out /scratch/bench   # or under sbatch --array
    glai-bench merge reports/bench/cuda /scratch/bench/shard-*-of-4
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from bench.cli_types import (
    non_negative_float,
    output_dir,
    positive_float,
    positive_int,
    positive_int_list,
)
from bench.harness import shards
from bench.harness.energy import MIN_WINDOW_S
from bench.harness.passes import DTYPES
from bench.harness.progress import Phases
from bench.harness.sweeps import ALIASES, ALL_PASSES, DEFAULT_PRESET, PRESETS

ROOT = Path(__file__).resolve().parent.parent
# with both suites under one --time-limit, the kernel suite's cap: its first-run cases took
# 53% and 44% of the two suites' time on the Zen 5 and the Intel Xeon kinds, and 59% of the
# Intel Xeon's 15-minute first-run limit (docs/notes/benchmarks.md, "A first run sized to the
# machine (issue 41 item 3, stop 54)"): 70% binds only on a slower machine, and leaves the
# pipeline 30% even there
KERNEL_SHARE = 0.7

# command -> (module whose main(argv) runs it, what it does); "run" is this module's. The
# studies (bench/studies/) are one-off measurements behind a decision recorded in
# docs/notes/README.md, kept runnable so the decision can be checked again.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("bench.__main__", "the kernel suite, then the GLAI pipeline (the default command)"),
    "pipeline": ("bench.pipeline.__main__", "the GLAI pipeline alone (the paper's tables)"),
    "gate": ("bench.gate.cli", "the regression gate: check | accept | measure"),
    "holdout": ("bench.gate.holdout", "the gate's false-alarm and miss rates from a baseline"),
    "dashboard": ("bench.reporting.dashboard",
                  "render reports/dashboard/index.html from the history"),
    "render": ("bench.reporting.render", "redraw a finished run's charts and summary.md"),
    "merge": ("bench.reporting.merge",
              "several runs of one machine kind as one report and dispatch table"),
    "predict": ("bench.reporting.predict",
                "roofline predictions for A100/H100 from datasheet peaks"),
    "cpu-targets": ("bench.studies.cpu_targets", "the C++ extension's CPU targets, in one run"),
    "kernel-peak": ("bench.studies.kernel_peak",
                    "each cpp kernel's share of the FMA peak beside it"),
    "dispatch-overhead": ("bench.studies.dispatch_overhead",
                          "what auto's dispatch table adds to a call, in microseconds"),
    "sparse-cpp-timing": ("bench.studies.sparse_cpp_timing",
                          "the sparse cpp kernels against dense cpp and their bytes floors"),
    "sparse-crossover": ("bench.studies.sparse_crossover",
                         "a pruned head's training step, dense against sparse layout, across μ"),
    "sparse-torch-candidates": ("bench.studies.sparse_torch_candidates",
                                "the pure-PyTorch candidates for the sparse torch backend"),
    "sparse-train-step": ("bench.studies.sparse_train_step",
                          "a GLAI training step on sparse cpp against the MLP's, per head"),
    "sparse-kernels-floor": ("bench.studies.sparse_kernels_floor",
                             "the sparse cpp kernels of a training step per kept entry "
                             "(--step: the engineered ratio with them at their floors)"),
    "step-anatomy": ("bench.studies.step_anatomy",
                     "the engineered steps' time by part, GLAI's and the MLP's side by side"),
    "call-anatomy": ("bench.studies.call_anatomy",
                     "one call's event time against its host and kernel times, per backend"),
    "vmap-heads": ("bench.studies.vmap_heads",
                   "torch.func.vmap over stacked heads against a loop of them (issue 43)"),
    "check-cuda": ("bench.tools.check_cuda",
                   "nvcc/ptxas check of the CUDA sources (no GPU needed)"),
    "check-headers": ("bench.tools.check_headers",
                      "the extension's C++ against another torch release's headers"),
}


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="glai-bench run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET,
                   help="which sweeps and how long to time, and the pipeline preset run after "
                        f"them (default: {DEFAULT_PRESET}, about 15 minutes on 2 CPU cores; "
                        "long and full: the complete sweeps; "
                        + ", ".join(f"{a} is {n}" for a, n in ALIASES.items()) + ")")
    p.add_argument("--suite", choices=("kernels", "pipeline", "all"), default="all",
                   help="kernel benchmarks, the GLAI pipeline, or both (default: all)")
    p.add_argument("--backends", type=_names, default=None,
                   help="comma-separated backend names (default: every registered one; "
                        "the registry's baseline backend always runs); sparse:NAME names "
                        "one of the sparse op's for the kept-fraction sweep (default: all)")
    p.add_argument("--peers", type=lambda t: [] if t.strip() == "none" else _names(t),
                   default=None,
                   help="comma-separated bench-only peers to time beside the backends "
                        "(einsum, max-autotune; bench/harness/peers.py), or none (default: the "
                        "preset's; the torch backend is always a peer)")
    p.add_argument("--install-dispatch", action="store_true",
                   help="copy the run's dispatch table for auto (written to "
                        "OUT/dispatch/<machine kind>.json) into glai_kernels/dispatch/, "
                        "which the package ships")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda when present, else cpu")
    p.add_argument("--dtypes", type=_names, default=None,
                   help=f"comma-separated, of {', '.join(DTYPES)} (default: the preset's)")
    p.add_argument("--passes", type=_names, default=None,
                   help=f"comma-separated, of {', '.join(ALL_PASSES)} (default: the preset's)")
    p.add_argument("--heads", type=_names, default=None,
                   help="comma-separated paper heads (A1..C2) to keep (default: all)")
    p.add_argument("--batches", type=positive_int_list, default=None,
                   help="comma-separated batch sizes to keep (default: the preset's)")
    p.add_argument("--sweeps", type=_names, default=None,
                   help="comma-separated sweep names to keep, e.g. heads or batch@A1 "
                        "(default: all of the preset's)")
    p.add_argument("--rounds", type=positive_int, default=None,
                   help="timing rounds per measurement (default: the preset's)")
    p.add_argument("--min-time", type=positive_float, default=None,
                   help="timed seconds per measurement (default: the preset's)")
    p.add_argument("--max-call", type=positive_float, default=None,
                   help="seconds: a case whose roofline floor exceeds this, or a backend "
                        "whose call takes 3x this, is skipped (default: the preset's)")
    p.add_argument("--time-limit", type=positive_float, default=None,
                   help="seconds: the run ends by itself within S of its start, closing "
                        "ceilings and reports included; shapes and backends whose estimates "
                        "do not fit are written as skipped, each saying why. With both suites "
                        f"the kernel suite has at most {KERNEL_SHARE * 100:.0f}%% of S and the "
                        "pipeline what it leaves, its units seed by seed, so that a limit "
                        "leaves out later seeds' units, each named (default: none)")
    p.add_argument("--energy-window", type=non_negative_float, default=MIN_WINDOW_S,
                   help="seconds of back-to-back calls per NVML energy reading; 0 turns "
                        f"energy off (default: {MIN_WINDOW_S:g})")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads (default: torch's choice, one per core)")
    p.add_argument("--out", type=output_dir, default=None,
                   help="kernel suite output folder (default: reports/bench/<device>)")
    p.add_argument("--pipeline-out", type=output_dir, default=ROOT / "reports" / "pipeline",
                   help="pipeline output folder (default: reports/pipeline)")
    p.add_argument("--history", type=output_dir, default=ROOT / "reports" / "history",
                   help="append this run's record to this history (default: reports/history)")
    p.add_argument("--no-history", action="store_true",
                   help="do not append a record to the history")
    shards.add_argument(p, "kernel cases and pipeline units")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--matmul-precision", choices=("highest", "high", "medium"), default=None,
                   help="torch.set_float32_matmul_precision for the run (default: leave "
                        "torch's setting, full float32): 'high' lets float32 products use "
                        "TF32 on CUDA, for the `cuda` backend and cuBLAS alike; recorded in "
                        "the provenance; not with --install-dispatch")
    return p


def run_pipeline(preset: str, out_dir: Path, shard: shards.Shard | None = None,
                 time_limit_s: float | None = None) -> bool:
    """Run bench.pipeline.run on the pipeline preset `preset` (a name of
    bench/pipeline/presets.py) when that package exists (only `shard`'s units, into
    out_dir/shard-K-of-N, when given; ending within `time_limit_s` when given); False when
    it does not."""
    if importlib.util.find_spec("bench.pipeline") is None:
        print("pipeline suite: bench/pipeline is not present; skipped")
        return False
    limit = {} if time_limit_s is None else {"time_limit_s": time_limit_s}
    # by module name, so that whatever sys.modules holds for it is what runs
    if shard is None:
        importlib.import_module("bench.pipeline").run(preset, out_dir, **limit)
    else:
        importlib.import_module("bench.pipeline").run(preset, out_dir / shard.folder,
                                                      shard=shard, **limit)
    return True


def units_left_out(results: Path, preset: str) -> str:
    """The line saying how many of a time-limited pipeline's units ran, and which did not."""
    try:
        units = json.loads(results.read_text())["meta"]["units"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"pipeline: no report to read at {results} ({e})"
    line = f"pipeline: {len(units['done'])} of {len(units['planned'])} units ran"
    left_out = units.get("not_run", []) + units.get("cut_off", [])
    if not left_out:
        return line + " within the time limit"
    return (f"{line}; the time limit left out {'; '.join(left_out)} (the tables' means are "
            f"over the units that ran; `glai-bench run --preset {preset}` without "
            "--time-limit runs them all)")


def overview() -> str:
    """The top-level help: the commands, one line each."""
    width = max(map(len, COMMANDS))
    lines = ["usage: glai-bench COMMAND [ARGS]   (or: python -m bench COMMAND [ARGS])", "",
             "commands:"]
    lines += [f"  {name:{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    lines += ["", "`glai-bench COMMAND --help` for a command's options; with no command, or with "
              "options only, the command is `run`."]
    return "\n".join(lines)


# commands that time torch's matmuls, which bench/harness/onednn_guard.py keeps from crashing (the
# gate's own entry point, bench/gate/cli.py, applies it for `gate` and `python -m bench.gate`)
TIMING_COMMANDS = ("run", "kernel-peak", "cpu-targets")


def main(argv: list[str] | None = None) -> int:
    """Dispatch `argv` (default sys.argv[1:]) to its command; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(overview())
        return 0
    if argv and argv[0] in COMMANDS:
        command, argv = argv[0], argv[1:]
    else:
        command = "run"  # `python -m bench --preset quick`, as before the commands
    try:
        return dispatch(command, argv)
    except Exception as e:  # the last line of defence: see unexpected()
        if os.environ.get("GLAI_BENCH_TRACEBACK") == "1":
            raise
        print(unexpected(command, e), file=sys.stderr)
        return 1


def dispatch(command: str, argv: list[str]) -> int:
    """Run `command` (a key of COMMANDS) with its arguments; returns the exit status."""
    if command in TIMING_COMMANDS:
        from bench.harness import onednn_guard

        reason = onednn_guard.apply()  # before this process's first bfloat16 matmul
        if reason:
            print(f"note: {reason}", file=sys.stderr)
    if command == "run":
        return run(argv)
    module = importlib.import_module(COMMANDS[command][0])
    status = module.main(argv)
    return int(status or 0)


def unexpected(command: str, error: Exception) -> str:
    """What `main` prints for an exception no command turned into a message of its own: one
    line naming the command and the error, and how to see the traceback. Every failure a
    command expects (bad arguments, a bad file) has its own message; this is for the rest,
    so that a user never has to read a traceback to learn what went wrong."""
    message = " ".join(str(error).split()) or "(no message)"
    return (f"glai-bench {command}: error: {type(error).__name__}: {message}\n"
            f"(set GLAI_BENCH_TRACEBACK=1 for the traceback)")


def run(argv: list[str]) -> int:
    """`glai-bench run`: the kernel suite, then the pipeline suite."""
    began = time.monotonic()
    phases = Phases()
    p = parser()
    args = p.parse_args(argv)
    if args.preset in ALIASES:
        print(f"note: preset {args.preset!r} is now named {ALIASES[args.preset]!r}")
    try:
        shard = shards.resolve(args.shard)
    except ValueError as e:  # a launcher's variable that is not a shard
        p.error(f"argument --shard: {e}")
    if shard is not None and args.install_dispatch:
        p.error("argument --install-dispatch: not with --shard (a shard's table covers part "
                "of the cases: install the merged one, glai-bench merge --install-dispatch)")
    if args.matmul_precision not in (None, "highest") and args.install_dispatch:
        # the table picks a backend per float32 cell for every later call, most of them at
        # full precision: a TF32 run's timings must not decide those
        p.error("argument --install-dispatch: not with --matmul-precision "
                f"{args.matmul_precision} (a table measured with TF32 would choose for "
                "full-precision calls)")
    if args.matmul_precision is not None:
        import torch

        torch.set_float32_matmul_precision(args.matmul_precision)
    command = " ".join(["glai-bench run", *argv])
    if shard is not None and args.shard is None:
        command += f" (shard {shard.number}/{shard.count} from {shard.source})"
    if args.suite in ("kernels", "all"):
        # Triton's CPU interpreter is for the correctness suite; timing it means nothing.
        if os.environ.get("TRITON_INTERPRET"):
            print("note: TRITON_INTERPRET is set; interpreted Triton kernels are being timed")
        from bench.harness import suite

        try:
            device = suite.resolve_device(args.device)
            out = args.out or ROOT / "reports" / "bench" / device.type
            if shard is not None:  # each shard its own folder: the merge joins them
                out = out / shard.folder
            started = time.perf_counter()
            output = suite.run(args.preset, device=args.device, backends=args.backends,
                               dtypes=args.dtypes, passes=args.passes, heads=args.heads,
                               batches=args.batches, sweeps=args.sweeps,
                               rounds=args.rounds,
                               min_time_s=args.min_time, max_call_s=args.max_call,
                               out_dir=out,
                               plots=not args.no_plots, progress=not args.no_progress,
                               threads=args.threads, peer_names=args.peers,
                               install_dispatch=args.install_dispatch,
                               time_limit_s=(args.time_limit * KERNEL_SHARE
                                             if args.time_limit and args.suite == "all"
                                             else args.time_limit),
                               energy_window_s=args.energy_window,
                               shard=shard, command=command)
        except ValueError as e:
            print(f"glai-bench run: error: {e}", file=sys.stderr)
            return 2
        print(f"kernel suite: {len(output.table)} rows in {time.perf_counter() - started:.0f} s")
        for name, seconds in output.meta.get("phases", {}).items():
            phases.add(f"kernel suite: {name}", seconds)
        for path in output.files:
            print(f"  wrote {path}")
        history_started = time.perf_counter()
        if not args.no_history and shard is None:  # a shard is part of a run: merge it
            from bench.reporting import history

            results = json.loads((out / "results.json").read_text())
            print(f"  appended {history.append(results, args.history)}")
            if args.history == history.HISTORY_DIR:
                from bench.reporting import dashboard

                # the run is recorded; a problem in the rest of the history (a bad record is
                # skipped with a warning, a foreign file is an error) must not stop the suite
                try:
                    page = dashboard.render(history.load(args.history), dashboard.OUT)
                    print(f"  wrote {page}")
                except (OSError, ValueError) as e:
                    print(f"python -m bench: dashboard not rendered: {e}", file=sys.stderr)
            phases.add("history and dashboard", time.perf_counter() - history_started)
    if args.suite in ("pipeline", "all"):
        pipeline = PRESETS[args.preset].pipeline_preset
        left = None
        if args.time_limit is not None:  # what the kernel suite left of the run's limit
            left = max(1.0, args.time_limit - (time.monotonic() - began))
        print(f"pipeline: the {pipeline} preset"
              + ("" if left is None else f", within the {left:.0f} s left of the run's limit"))
        with phases.phase(f"pipeline ({pipeline} preset)"):
            run_pipeline(pipeline, args.pipeline_out, shard, time_limit_s=left)
        if left is not None and shard is None:
            print(units_left_out(args.pipeline_out / "results.json", args.preset))
    print("\n".join(phases.lines("glai-bench run")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
