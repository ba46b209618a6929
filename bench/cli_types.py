"""argparse `type=` functions shared by every `glai-bench` command's parser.

A bad value fails while the arguments are parsed, before anything is measured or written,
with argparse's own message and exit status 2:

    glai-bench run: error: argument --threads: must be a positive integer, got '0'

argparse adds the `argument --NAME:` part to the `ArgumentTypeError` each function raises, so
the messages here say only what is wrong with the value.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def _number(text: str, kind: Callable[[str], float], what: str, ok: Callable[[float], bool]):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if value != value or not ok(value):  # NaN compares unequal to itself and passes no bound
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer > 0 (threads, rounds, repeats, runs)."""
    return _number(text, int, "a positive integer", lambda v: v > 0)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a count where 0 means none, e.g. the gate's re-measurements)."""
    return _number(text, int, "a non-negative integer", lambda v: v >= 0)


def at_least(minimum: int) -> Callable[[str], int]:
    """An integer >= `minimum` (e.g. a baseline's runs: at least 3 to measure a spread)."""
    def parse(text: str) -> int:
        return _number(text, int, f"an integer of at least {minimum}", lambda v: v >= minimum)

    parse.__name__ = f"at_least_{minimum}"
    return parse


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, factors)."""
    return _number(text, float, "a positive number", lambda v: 0 < v < float("inf"))


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (a window or floor where 0 means off)."""
    return _number(text, float, "a non-negative number", lambda v: 0 <= v < float("inf"))


def fraction(text: str) -> float:
    """A number in (0, 1] (a kept fraction, a target share)."""
    return _number(text, float, "a number in (0, 1]", lambda v: 0 < v <= 1)


def percent(text: str) -> float:
    """A number in (0, 100] (a kept fraction in percent)."""
    return _number(text, float, "a percentage in (0, 100]", lambda v: 0 < v <= 100)


def positive_int_list(text: str) -> list[int]:
    """Comma-separated integers > 0, at least one ("16,256")."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, "
                                         f"got {text!r}")
    try:
        return [positive_int(t) for t in items]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, "
                                         f"got {text!r}") from None


def existing_dir(text: str) -> Path:
    """A folder that exists (something to read from)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such folder: {text}")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a folder: {text}")
    return path


def existing_file(text: str) -> Path:
    """A file that exists and is readable (its contents are checked where it is read)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"a folder, not a file: {text}")
    try:
        with path.open("rb"):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {e.strerror}") from None
    return path


def _file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of `path` that is not a folder (mkdir would fail on it)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def output_dir(text: str) -> Path:
    """A folder to write into: it may not exist yet, but neither it nor a folder above it
    may be a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"a file, not a folder: {text}")
    blocker = _file_above(path)
    if blocker is not None:
        raise argparse.ArgumentTypeError(f"cannot create {text}: {blocker} is a file")
    return path


def output_file(text: str) -> Path:
    """A file to write: it may not exist yet, but it may not be a folder, nor may a folder
    above it be a file."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"a folder, not a file: {text}")
    blocker = _file_above(path)
    if blocker is not None:
        raise argparse.ArgumentTypeError(f"cannot create {text}: {blocker} is a file")
    return path
