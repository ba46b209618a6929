"""`python -m bench.pipeline --preset default --out reports/pipeline`."""

from __future__ import annotations

import argparse
import pathlib

from bench.pipeline.presets import PRESETS
from bench.pipeline.runner import run_preset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("reports/pipeline"))
    parser.add_argument("--heads", help="comma-separated subset, e.g. A1,C1")
    parser.add_argument("--seeds", type=int, help="number of seeds (default: the preset's 3)")
    parser.add_argument("--data", action="append", default=[], metavar="HEAD=FILE",
                        help="users' own embeddings for a head (.npz/.pt; see "
                             "bench/pipeline/data.py); replaces the built-in data")
    parser.add_argument("--switch", choices=("fixed", "auto", "both"),
                        help="reduced-MLP stage length: the paper's fixed fractions, until the "
                             "path distance m_t settles, or both side by side (default)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: steadier clocks on a shared "
                             "machine; 0 leaves torch's default)")
    parser.add_argument("--jobs", type=int,
                        help="(head, data, seed) units run at once, each in its own process "
                             "(default: on CPU one per core / threads, on CUDA 1); the records "
                             "do not depend on it, only the wall clock does")
    parser.add_argument("--device", help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave torch.compile out of the engineered protocol's MLP step "
                             "candidates (the hand-fused step alone)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    files = {}
    for item in args.data:
        head, _, path = item.partition("=")
        if not path:
            parser.error(f"--data takes HEAD=FILE, got {item!r}")
        files[head] = pathlib.Path(path)
    run_preset(args.preset, args.out, heads=args.heads.split(",") if args.heads else None,
               seeds=args.seeds, data_files=files, switch=args.switch, device=args.device,
               progress=not args.no_progress, threads=args.threads or None, jobs=args.jobs,
               compile_mlp=False if args.no_compile else None)


if __name__ == "__main__":
    main()
