"""The layout crossover per machine kind: the kept fraction K / (O·I·P') at or below which a
pruned head's training step is faster in the sparse layout than in the dense one.

`prune(layout="auto")` (glai_kernels/glai/prune.py) asks `for_kind(kind, shape)`:

1. **measured**: the shipped table `<machine kind>.layout_crossover.json` in the dispatch
   folder (`table_dir()`, so $GLAI_DISPATCH_DIR too), or the nearest measured kind's (kinds.py:
   same instruction set, then vendor), written by the kept-fraction sweep's `step` pass
   (bench/harness/crossover_table.py) and installed with `--install-dispatch`;
2. else, on a CUDA kind, a **prediction** for the head's shape (`predict`, below);
3. else None: the caller's own rule (prune's `SPARSE_CROSSOVER` per device type).

A table that cannot be read (bad JSON, a field missing or of the wrong type, a fraction
outside [0, 1], a newer schema) is no table: one warning naming the file and why, then the
next rule.

**The prediction (a roofline estimate, never a measurement).** One training step moves, per
weight element of the dense layout, the weight read by the forward, dweight written by the
backward, the gradient mask's pass (read dweight and the mask, write dweight) and fused Adam
(read weight, dweight, m, v; write weight, m, v): 11 elements + 1 mask byte; per kept entry of
the sparse layout, the forward's value and input index, dvalues' input and group indexes and
the fused update's values, m, v read and written: 7 elements + 12 index bytes (float32: 45
against 40 bytes). Each at a share of the GPU's datasheet bandwidth: the dense passes stream
(`DENSE_SHARE`), the sparse ones gather (`SPARSE_SHARE`, docs/notes/sparse.md, "cuda
(sparse)": 10-15% predicted at B = 16). Both steps cost at least `STEP_FLOOR_S`, the dense
op's host- and launch-bound floor at the small heads (docs/notes/cuda.md, "An H100 lease:
three bugs only a GPU showed, then the heads sweep (stop 29)": `cuda` `both` at A2 and C1,
B = 16, 129 µs). Sparse wins while max(floor, K·sparse bytes / (share·bandwidth)) <=
max(floor, N·dense bytes / (share·bandwidth)), so the crossover is

    min(1, max(floor, N·dense bytes / (DENSE_SHARE·bw)) · SPARSE_SHARE·bw / (N·sparse bytes))

with N = O·I·P': on an H100 SXM (3.35 TB/s) ≈ 71% at A1 (the dense step floor-bound) and
≈ 19% at B1 (bandwidth-bound).
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

from glai_kernels import dispatch
from glai_kernels.dispatch import kinds

KIND = "glai-kernels-layout-crossover"
SCHEMA = 1
SUFFIX = "layout_crossover"  # <machine kind>.layout_crossover.json

# the prediction's constants (module docstring)
DENSE_SHARE = 0.7
SPARSE_SHARE = 0.12
STEP_FLOOR_S = 129e-6
DENSE_ELEMENTS, DENSE_EXTRA_BYTES = 11, 1  # per weight element: elements moved, mask bytes
SPARSE_ELEMENTS, SPARSE_INDEX_BYTES = 7, 12  # per kept entry: elements moved, int32 index bytes
# datasheet HBM bandwidths (bytes/s) by a word of the device's name, the first that matches
DATASHEET_BANDWIDTH: tuple[tuple[tuple[str, ...], float], ...] = (
    (("H200",), 4.8e12),
    (("H100", "PCIe"), 2.0e12),
    (("H100",), 3.35e12),
    (("A100", "40GB"), 1.555e12),
    (("A100",), 2.039e12),
)
ASSUMED_BANDWIDTH = 2.0e12  # a GPU not listed above


@dataclass(frozen=True)
class Crossover:
    """A kept fraction and where it comes from: "measured" (a table; `detail` names the file
    and, for a stand-in, the kind it was measured on) or "prediction" (`detail`: its numbers)."""

    fraction: float
    source: str
    detail: str


def table_path(kind: str, directory: Path) -> Path:
    return directory / f"{kind}.{SUFFIX}.json"


def parse_table(data: object, where: str) -> float:
    """The crossover of a table's JSON object; ValueError naming `where` and what is wrong."""
    dispatch.check_header(data, where, "layout crossover table", KIND, SCHEMA)
    value = data.get("crossover")
    # bool is an int to Python: not a fraction
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{where}: crossover must be a number in [0, 1], got {value!r}")
    if not isinstance(data.get("machine_kind"), str):
        raise ValueError(f"{where}: machine_kind must be a string, got "
                         f"{data.get('machine_kind')!r}")
    return float(value)


@functools.cache
def _read(path: Path) -> float | None:
    """The crossover in `path`, None when there is none or it cannot be used (then with one
    warning, cached: once per process)."""
    if not path.exists():
        return None
    try:
        return parse_table(json.loads(path.read_text()), str(path))
    except (OSError, UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        reason = str(e) if str(e).startswith(str(path)) else f"{path}: {type(e).__name__}: {e}"
        warnings.warn(f"glai_kernels ignores the layout crossover table {reason}; "
                      "prune(layout='auto') falls back to the next rule", RuntimeWarning,
                      stacklevel=2)
        return None


def measured_kinds(directory: Path) -> list[str]:
    """The machine kinds with a layout crossover table in `directory`."""
    suffix = f".{SUFFIX}"
    return sorted(p.stem[: -len(suffix)] for p in directory.glob(f"*{suffix}.json")
                  if kinds.parse(p.stem[: -len(suffix)]) is not None)


def measured(kind: str, directory: Path) -> Crossover | None:
    """The measured crossover of `kind` (its own table, else the nearest measured kind's
    usable one), None when there is none."""
    own = _read(table_path(kind, directory))
    if own is not None:
        return Crossover(own, "measured", str(table_path(kind, directory)))
    candidates = measured_kinds(directory)
    while candidates:
        other = kinds.nearest(kind, candidates)
        if other is None:
            return None
        value = _read(table_path(other, directory))
        if value is not None:
            return Crossover(value, "measured", f"{table_path(other, directory)} (measured on "
                                                f"{other}, the nearest measured kind to {kind})")
        candidates.remove(other)
    return None


def bandwidth(kind: str) -> tuple[float, str]:
    """(bytes/s, where it comes from) of a CUDA kind's memory: the datasheet's by name."""
    parts = kinds.parse(kind)
    name = parts.name if parts is not None else kind
    words = set(name.split("-"))
    for needed, value in DATASHEET_BANDWIDTH:
        if all(w in words for w in needed):
            return value, f"{' '.join(needed)} datasheet"
    return ASSUMED_BANDWIDTH, "assumed (GPU not in the datasheet list)"


def predict(kind: str, shape: tuple[int, int, int], element_bytes: int = 4) -> Crossover:
    """The roofline prediction for a pruned head of `shape` (O, I, P') on CUDA kind `kind`
    (module docstring)."""
    bw, where = bandwidth(kind)
    weights = max(1, math.prod(shape))
    dense_bytes = DENSE_ELEMENTS * element_bytes + DENSE_EXTRA_BYTES
    sparse_bytes = SPARSE_ELEMENTS * element_bytes + SPARSE_INDEX_BYTES
    dense_s = max(STEP_FLOOR_S, weights * dense_bytes / (DENSE_SHARE * bw))
    fraction = min(1.0, dense_s * SPARSE_SHARE * bw / (weights * sparse_bytes))
    return Crossover(fraction, "prediction",
                     f"roofline prediction: {bw / 1e12:.3g} TB/s ({where}), dense step "
                     f"{1e6 * dense_s:.0f} µs for {weights:,} weights, sparse gathers at "
                     f"{SPARSE_SHARE:.0%} of the bandwidth")


def for_kind(kind: str, shape: tuple[int, int, int], directory: Path,
             element_bytes: int = 4) -> Crossover | None:
    """The crossover `prune(layout="auto")` follows on machine kind `kind` for a head of
    `shape` (O, I, P'): measured, else predicted on a CUDA kind, else None."""
    found = measured(kind, directory)
    if found is not None:
        return found
    parts = kinds.parse(kind)
    if parts is not None and parts.device == "cuda":
        return predict(kind, shape, element_bytes)
    return None


def clear_cache() -> None:
    """Forget the tables read (tests write their own)."""
    _read.cache_clear()
