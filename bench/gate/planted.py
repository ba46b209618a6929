"""A deliberately slowed backend, to prove that the regression gate catches a slowdown.

    with slowed("torch", 1.25):       # every call of the torch backend takes 25% longer
        ...run the quick preset...
    with from_spec("torch=1.25"):     # the same, from the gate's --plant argument
        ...

The variant computes the same result, then busy-waits (factor - 1) × the time the real call
took, so the slowdown is the stated fraction of the backend's own time at every shape, as a
real regression in its kernel would be. Busy-waiting, not sleeping, keeps the core occupied
the way slower arithmetic would.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from glai_kernels import registry


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def slow_down(fn: Callable, factor: float) -> Callable:
    """`fn` taking `factor` times as long, same result."""
    @functools.wraps(fn)
    def slower(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        _spin((factor - 1.0) * (time.perf_counter() - start))
        return out

    return slower


@contextmanager
def slowed(name: str, factor: float) -> Iterator[registry.Backend]:
    """Within the block, backend `name` is a variant `factor` (> 1) times slower."""
    if factor <= 1.0:
        raise ValueError(f"factor: expected a slowdown > 1, got {factor}")
    original = registry.get(name)
    variant = dataclasses.replace(
        original,
        forward=slow_down(original.forward, factor),
        backward=slow_down(original.backward, factor),
        forward_saving=(slow_down(original.forward_saving, factor)
                        if original.forward_saving else None),
        description=f"{original.description} (deliberately slowed {factor}x)")
    registry.replace(variant)
    try:
        yield variant
    finally:
        registry.replace(original)


@contextmanager
def from_spec(spec: str | None) -> Iterator[registry.Backend | None]:
    """`slowed` from a "BACKEND=FACTOR" string (the gate's `--plant`); no-op for None."""
    if not spec:
        yield None
        return
    name, sep, factor = spec.partition("=")
    if not sep:
        raise ValueError(f"--plant: expected BACKEND=FACTOR (e.g. torch=1.25), got {spec!r}")
    with slowed(name, float(factor)) as variant:
        yield variant
