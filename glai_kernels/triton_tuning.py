"""Tuning the `triton` backend's launch configurations on a GPU, each choice kept on disk.

The backend (glai_kernels/backends/triton.py) hands `choose` a kernel's candidates, already
pruned by its cost model and sorted best-predicted first, and a function that times one. The
first call at a new key times them, best-predicted first, until TUNE_BUDGET_S is spent, and
writes the winner to one small JSON file under the package's cache folder
($GLAI_KERNELS_CACHE/triton-autotune/, beside the extension's builds); later calls, in this
process or any other, read it back and time nothing. Triton's own `cache_results=True` is not
used: it gives up on configs with a pre_hook, is off under the interpreter (where the tests
run), and a corrupt file raises instead of being ignored.

A key names the kernel, its shape key (the batch as its power-of-two bucket), the dtype and
the float32 dot precision, the device's name and Triton's version: a cached choice is never
reused for another GPU or another Triton. `tuning_log()` says, per key met in this process,
whether it was tuned (and in how many seconds) or read from the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from glai_kernels.extension_build import cache_root

C = TypeVar("C")

# Seconds of timing per kernel and key at most (the first candidate is always timed whole):
# three kernels' tuning then stays under the issue's 5 s a shape, compilation included, with
# a few candidates each (docs/notes/triton.md, "TF32, split-K to the SM count, a 5-second
# autotune (issue 38, stop 45)").
TUNE_BUDGET_S = 1.0
CACHE_FOLDER = "triton-autotune"


@dataclass(frozen=True)
class TuningRecord:
    """One key met in this process: tuned (`seconds` of timing `timed` candidates) or read
    back from `path` (seconds 0, timed 0)."""

    kernel: str
    key: tuple[tuple[str, object], ...]
    config: object
    seconds: float
    timed: int
    source: str  # "tuned" or "cache"
    path: str


_CHOSEN: dict[tuple, object] = {}
_LOG: list[TuningRecord] = []


def tuning_log() -> list[TuningRecord]:
    """What was tuned or read back in this process, in order (the benchmark's report of the
    tuning cost per new shape)."""
    return list(_LOG)


def forget() -> None:
    """Drop this process's chosen configs and log (tests; the disk cache stays)."""
    _CHOSEN.clear()
    _LOG.clear()


def cache_dir() -> Path:
    return cache_root() / CACHE_FOLDER


def cache_path(kernel: str, key: Mapping[str, object]) -> Path:
    """The file holding the choice for `kernel` at `key` (every value in the key counts)."""
    text = json.dumps([kernel, sorted((k, str(v)) for k, v in key.items())])
    return cache_dir() / f"{kernel}-{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"


def _read(path: Path, kernel: str, key: dict, make: Callable[..., C]) -> C | None:
    """The config stored at `path` for (kernel, key), None when there is none; a file that
    cannot be read back is ignored with a warning naming it (and rewritten by the caller)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as error:
        warnings.warn(f"ignoring the triton autotune cache file {path}: {error}", stacklevel=3)
        return None
    try:
        stored = json.loads(text)
        if stored["kernel"] != kernel or stored["key"] != {k: str(v) for k, v in key.items()}:
            raise ValueError("it holds another kernel's or another shape's choice")
        return make(**stored["config"])
    except (ValueError, KeyError, TypeError) as error:
        warnings.warn(f"ignoring the corrupt triton autotune cache file {path}: "
                      f"{type(error).__name__}: {error}", stacklevel=3)
        return None


def _write(path: Path, kernel: str, key: dict, config: object, seconds: float,
           timings: list[tuple[object, float]]) -> None:
    """Write atomically (a temporary file renamed), so a reader in another process sees the
    old file or the new one, never half of one; a cache that cannot be written is skipped."""
    record = {
        "kernel": kernel,
        "key": {k: str(v) for k, v in key.items()},
        "config": dataclasses.asdict(config),
        "tune_s": round(seconds, 4),
        "timings_s": [[dataclasses.asdict(c), t] for c, t in timings],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as error:
        warnings.warn(f"could not write the triton autotune cache file {path}: {error}",
                      stacklevel=3)


def choose(kernel: str, key: Mapping[str, object], candidates: Callable[[], Sequence[C]],
           time_one: Callable[[C], float], budget_s: float = TUNE_BUDGET_S) -> C:
    """The config to launch `kernel` with at `key`: this process's earlier choice, else the
    disk cache's, else the fastest of `candidates()` (best-predicted first; dataclasses) by
    `time_one` (seconds per call), timed until `budget_s` is spent, then cached.

    A call after the first at a key costs one dict lookup: `candidates` is called, and the
    key hashed to a file name, only when this process has not met the key before. One
    candidate is returned without timing (nor caching: nothing was measured)."""
    memo = (kernel, tuple(key.items()))
    if memo in _CHOSEN:
        return _CHOSEN[memo]
    key = dict(key)
    candidates = list(candidates())
    if not candidates:
        raise ValueError(f"no candidate configs for {kernel} at {key}")
    path = cache_path(kernel, key)
    if len(candidates) == 1:
        _CHOSEN[memo] = candidates[0]
        return candidates[0]
    cached = _read(path, kernel, key, type(candidates[0]))
    if cached is not None:
        _CHOSEN[memo] = cached
        _LOG.append(TuningRecord(kernel, tuple(key.items()), cached, 0.0, 0, "cache", str(path)))
        return cached
    start = time.perf_counter()
    timings: list[tuple[C, float]] = []
    for candidate in candidates:
        timings.append((candidate, time_one(candidate)))
        if time.perf_counter() - start >= budget_s:
            break
    seconds = time.perf_counter() - start
    best = min(timings, key=lambda pair: pair[1])[0]
    _write(path, kernel, key, best, seconds, timings)
    _CHOSEN[memo] = best
    _LOG.append(TuningRecord(kernel, tuple(key.items()), best, seconds, len(timings), "tuned",
                             str(path)))
    return best
