"""`python -m bench.pipeline --preset default --out reports/pipeline`.

Past one machine or one lease: `--shard K/N` (or a SLURM job array's or torchrun's
variables) runs shard K of N's (head, data, seed) units into OUT/shard-K-of-N, and
`glai-bench merge --pipeline OUT SHARD...` joins the shards' records into one report.
`--unit-time-limit S` runs each unit in a process of its own and stops one past S seconds;
the report is rewritten after every unit, so a run cut off by its lease keeps what finished.
`--time-limit S` ends the whole run by itself within S seconds, its report written: a unit
that could not finish in what is left is not started, and the report names it.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys

from bench.cli_types import (
    existing_file,
    non_negative_int,
    output_dir,
    positive_float,
    positive_int,
)
from bench.harness import shards
from bench.pipeline.presets import PRESETS
from bench.pipeline.runner import run_preset
from glai_kernels.paper_heads import PAPER_HEADS


def head_list(text: str) -> list[str]:
    """`--heads A1,C1`: comma-separated paper heads, at least one."""
    heads = [h.strip() for h in text.split(",") if h.strip()]
    unknown = sorted(set(heads) - set(PAPER_HEADS))
    if not heads or unknown:
        raise argparse.ArgumentTypeError(f"expected comma-separated paper heads of "
                                         f"{', '.join(PAPER_HEADS)}, got {text!r}")
    return heads


def data_file(text: str) -> tuple[str, pathlib.Path]:
    """`--data HEAD=FILE`: a paper head and a readable .npz or .pt file of its embeddings
    (read here once, so a bad file is named before any head is trained)."""
    from bench.pipeline.data import load_embeddings

    head, sep, name = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected HEAD=FILE, got {text!r}")
    if head not in PAPER_HEADS:
        raise argparse.ArgumentTypeError(f"unknown head {head!r} in {text!r}; the paper's are "
                                         f"{', '.join(PAPER_HEADS)}")
    path = existing_file(name)
    try:
        load_embeddings(path, need_labels=False)
    except Exception as e:  # numpy and torch raise many kinds for a file that is not theirs
        raise argparse.ArgumentTypeError(f"{path}: not readable embeddings "
                                         f"({type(e).__name__}: {e})") from None
    return head, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--out", type=output_dir, default=pathlib.Path("reports/pipeline"))
    parser.add_argument("--heads", type=head_list, help="comma-separated subset, e.g. A1,C1")
    parser.add_argument("--seeds", type=positive_int,
                        help="number of seeds (default: the preset's 3)")
    parser.add_argument("--data", action="append", default=[], metavar="HEAD=FILE",
                        type=data_file,
                        help="users' own embeddings for a head (.npz/.pt; see "
                             "bench/pipeline/data.py); replaces the built-in data")
    parser.add_argument("--switch", choices=("fixed", "auto", "both"),
                        help="reduced-MLP stage length: the paper's fixed fractions, until the "
                             "path distance m_t settles, or both side by side (default)")
    parser.add_argument("--threads", type=non_negative_int, default=1,
                        help="torch intra-op threads (default 1: steadier clocks on a shared "
                             "machine; 0 leaves torch's default)")
    parser.add_argument("--jobs", type=positive_int,
                        help="(head, data, seed) units run at once, each in its own process "
                             "(default: on CPU one per core / threads, on CUDA 1); the records "
                             "do not depend on it, only the wall clock does")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave torch.compile out of the engineered protocol's MLP step "
                             "candidates (the hand-fused step alone)")
    parser.add_argument("--unit-time-limit", type=positive_float, metavar="S",
                        help="seconds: each (head, data, seed) unit runs in a process of its "
                             "own and is stopped past S, listed in the report as cut off "
                             "(default: no limit; units in this process unless --jobs > 1)")
    parser.add_argument("--time-limit", type=positive_float, metavar="S",
                        help="seconds: the whole run ends by itself within S, its report "
                             "written; a unit that cannot finish in what is left (its "
                             "--unit-time-limit, else the longest unit so far) is not started "
                             "and is named in the report (default: no limit)")
    shards.add_argument(parser, "(head, data, seed) units", "glai-bench merge --pipeline")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        shard = shards.resolve(args.shard)
    except ValueError as e:  # a launcher's variable that is not a shard
        parser.error(f"argument --shard: {e}")
    out = args.out if shard is None else args.out / shard.folder
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("argument --device: cuda: no CUDA device here")
    # a lease's SIGTERM ends the run as Ctrl-C would: the units' processes are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        run_preset(args.preset, out, heads=args.heads, seeds=args.seeds,
                   data_files=dict(args.data), switch=args.switch, device=args.device,
                   progress=not args.no_progress, threads=args.threads or None,
                   jobs=args.jobs, compile_mlp=False if args.no_compile else None,
                   shard=shard, unit_time_limit_s=args.unit_time_limit,
                   time_limit_s=args.time_limit)
    except ValueError as e:  # a data file that does not fit its head, a shard with no unit
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
