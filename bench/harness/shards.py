"""A run split over N machines or processes: which shard this process is, and its part.

    shard = resolve(args.shard, os.environ)   # --shard K/N, else SLURM's or torchrun's
    mine = split(cases, case_cost, shard)     # this shard's cases, in their original order

Shards are numbered 1..N (`--shard 1/4` is the first of four), as their folders are named
(`shard-1-of-4`). Without the flag, the launcher's environment names the shard: a SLURM job
array's `SLURM_ARRAY_TASK_ID` (counted from `SLURM_ARRAY_TASK_MIN`, 0 when unset) out of
`SLURM_ARRAY_TASK_COUNT`, or torchrun's 0-based `RANK` out of `WORLD_SIZE` (only when
WORLD_SIZE > 1: a single torchrun process is an ordinary run).

The split is deterministic and balanced: the items, longest first by an estimated cost (ties
in their original order), each go to the bin with the least cost so far (the lowest-numbered
on a tie), so every shard computes the same partition without talking to the others. The
shards' folders are joined by `glai-bench merge` (kernels) or `glai-bench merge --pipeline`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """Shard `number` (1-based) of `count`; `source` says what named it (flag, SLURM,
    torchrun)."""

    number: int
    count: int
    source: str = "--shard"

    def __post_init__(self) -> None:
        if not 1 <= self.number <= self.count:
            raise ValueError(f"shard must be K/N with 1 <= K <= N, got {self.number}/"
                             f"{self.count}")

    @property
    def folder(self) -> str:
        """This shard's folder name under the run's output folder: shard-K-of-N."""
        return f"shard-{self.number}-of-{self.count}"

    def provenance(self) -> dict:
        """What a shard's results record about it (merge checks the shards it joins)."""
        return {"number": self.number, "count": self.count, "source": self.source}


def parse(text: str) -> Shard:
    """argparse type of `--shard K/N`: shard K (1-based) of N."""
    number, sep, count = text.partition("/")
    try:
        shard = Shard(int(number), int(count))
    except ValueError:  # not integers, or K outside 1..N
        raise argparse.ArgumentTypeError(
            f"must be K/N with 1 <= K <= N (shards are numbered from 1), got {text!r}") from None
    if not sep:
        raise argparse.ArgumentTypeError(f"must be K/N, got {text!r}")
    return shard


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = environ.get(name)
    if text is None and default is not None:
        return default
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"${name} must be an integer, got {text!r}") from None


def from_environment(environ: Mapping[str, str]) -> Shard | None:
    """The shard a launcher's variables name (SLURM job array, then torchrun), or None.
    ValueError naming the variable when one is malformed or out of range."""
    if "SLURM_ARRAY_TASK_ID" in environ and "SLURM_ARRAY_TASK_COUNT" in environ:
        task = _int(environ, "SLURM_ARRAY_TASK_ID")
        first = _int(environ, "SLURM_ARRAY_TASK_MIN", 0)
        count = _int(environ, "SLURM_ARRAY_TASK_COUNT")
        if count > 1:
            try:
                return Shard(task - first + 1, count, "SLURM")
            except ValueError:
                raise ValueError(f"$SLURM_ARRAY_TASK_ID {task} is not within "
                                 f"$SLURM_ARRAY_TASK_MIN {first} + $SLURM_ARRAY_TASK_COUNT "
                                 f"{count} (array ids must be consecutive)") from None
    if "WORLD_SIZE" in environ:
        size = _int(environ, "WORLD_SIZE")
        if size > 1:
            rank = _int(environ, "RANK")
            try:
                return Shard(rank + 1, size, "torchrun")
            except ValueError:
                raise ValueError(f"$RANK must be in 0..{size - 1} ($WORLD_SIZE {size}), got "
                                 f"{rank}") from None
    return None


def resolve(flag: Shard | None, environ: Mapping[str, str] | None = None) -> Shard | None:
    """`--shard` when given, else the launcher's (`from_environment`), else None."""
    if flag is not None:
        return flag
    return from_environment(os.environ if environ is None else environ)


def assign(costs: Sequence[float], count: int) -> list[int]:
    """Each item's bin (0-based) of `count`: greedy longest-first into the least-loaded
    bin, ties broken by original order and lowest bin, so the result is deterministic."""
    loads = [0.0] * count
    bins = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):  # sorted() is stable
        b = min(range(count), key=lambda k: loads[k])  # min() keeps the first of equals
        bins[i] = b
        loads[b] += costs[i]
    return bins


def split(items: Sequence[T], cost: Callable[[T], float], shard: Shard | None) -> list[T]:
    """`shard`'s part of `items` (all of them for None), in their original order."""
    if shard is None:
        return list(items)
    bins = assign([float(cost(item)) for item in items], shard.count)
    return [item for item, b in zip(items, bins, strict=True) if b == shard.number - 1]


def add_argument(parser: argparse.ArgumentParser, what: str,
                 merge: str = "glai-bench merge") -> None:
    """The `--shard K/N` option, the same for `glai-bench run` and `glai-bench pipeline`
    (`what` it splits, the `merge` command that joins the shards)."""
    parser.add_argument(
        "--shard", type=parse, default=None, metavar="K/N",
        help=f"run only shard K of N (numbered from 1, e.g. 2/4) of the {what}, balanced by "
             "an estimated cost, into OUT/shard-K-of-N, with no history, dashboard or "
             f"installed dispatch table (`{merge}` joins the shards). Default: "
             "SLURM's job array ($SLURM_ARRAY_TASK_ID - $SLURM_ARRAY_TASK_MIN + 1 of "
             "$SLURM_ARRAY_TASK_COUNT) or torchrun's ($RANK + 1 of $WORLD_SIZE, when > 1); "
             "else the whole run")


def coverage(shards: list[dict]) -> dict:
    """Which shards of how many were merged, and which are missing (a shard's provenance:
    {"number": K, "count": N, ...})."""
    counts = sorted({s["count"] for s in shards})
    count = max(counts)
    numbers = sorted({s["number"] for s in shards})
    missing = [k for k in range(1, count + 1) if k not in numbers]
    return {"count": count, "merged": numbers, "missing": missing,
            **({"counts_differ": counts} if len(counts) > 1 else {})}
