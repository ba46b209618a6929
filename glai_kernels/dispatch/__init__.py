"""Measured dispatch tables: which backend `auto` runs, per machine kind, from a benchmark run.

`python -m bench run` measures every backend on the preset's cases and writes, for the machine
kind it ran on (`machine_kind`), a table of the measured winners among the backends `auto`
may choose (those with an `auto_priority` for the device). The package ships the tables in
this folder as `<machine kind>.json`; `auto` (`registry.pick_auto`) consults the one for the
current machine:

    key     (dtype, mode, batch bucket, size class)
    mode    "forward" (no gradient), "train" (only weight needs one: GLAI's training step,
            selector and backbone frozen) or "both" (x or act needs one too); the backward
            runs on the backend the forward chose
    batch bucket   the next power of two >= B                       (`batch_bucket`)
    size class     ceil(log2(O * I * P)), the weight's elements       (`size_class`)

A call whose key has no entry takes the nearest entry of its dtype and mode (fewest octaves
of batch plus size classes away). A machine kind with no table of its own takes the table of
the nearest measured kind (same instruction set and vendor, then same instruction set;
`kinds.py`), and says so (`Table.stand_in_for`, `python -m glai_kernels`); with no entry for
its dtype and mode, no table of its kind or a near one, or a winner that cannot run here,
`auto` falls back to the priorities.

The dense op's table is `<machine kind>.json`; another op's is `<machine kind>.<op>.json`
(the sparse op's: `<machine kind>.sparse_estimator.json`).

A table that cannot be read or parsed (truncated JSON, a field missing or of the wrong type,
another kind of file, a newer schema, a folder in its place) is no table: `auto` warns once,
naming the file and what is wrong with it, and falls back to the priorities.

$GLAI_DISPATCH_DIR names another folder to read the tables from (your own measurements, or
a test's), in place of the shipped one (`table_dir()`); it is read when a table is first
needed, so a process that changes it afterwards calls `clear_cache()`.

Cost: the table is read once per process and each distinct call shape is looked up once
(`_PICKS` caches the answer), so a call pays a few dict lookups; on a machine kind without a
table the op does not even build the call's key (`has_table`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch

from glai_kernels.dispatch import kinds

SCHEMA = 1
KIND = "glai-kernels-dispatch-table"
TABLE_DIR = Path(__file__).resolve().parent
DIR_VAR = "GLAI_DISPATCH_DIR"
MODES: tuple[str, ...] = ("forward", "both", "train")
# distinct call shapes remembered per process before the cache starts again
_PICKS_MAX = 4096


class Call(NamedTuple):
    """What `auto` knows of one estimator call beyond its device and dtype. A plain tuple
    of the same fields is taken too (the op builds one per call: cheaper)."""

    mode: str  # one of MODES
    batch: int
    inputs: int
    paths: int
    outputs: int


def call_mode(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> str:
    """The mode of a call with these inputs: "forward" when no gradient will be taken,
    "train" when only weight needs one, else "both"."""
    if not torch.is_grad_enabled():
        return "forward"
    if x.requires_grad or act.requires_grad:
        return "both"
    return "train" if weight.requires_grad else "forward"


def batch_bucket(batch: int) -> int:
    """The next power of two >= batch (16 -> 16, 17 -> 32, 1 -> 1)."""
    return 1 << max(0, int(batch) - 1).bit_length()


def size_class(inputs: int, paths: int, outputs: int) -> int:
    """ceil(log2(O * I * P)): the weight's size in octaves (A1's 3.6M elements -> 22)."""
    return max(0, int(inputs) * int(paths) * int(outputs) - 1).bit_length()


def thread_bucket(threads: int) -> int:
    """The next power of two >= threads: a table measured at 2 threads serves 2, not 3."""
    return 1 << max(0, int(threads) - 1).bit_length()


def _slug(text: str) -> str:
    # as bench/reporting/history.py's slug, which names reports/baseline/<machine kind>.json
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "unknown"


@functools.cache
def cpu_id() -> str:
    """"AuthenticAMD family 26 model 2" from /proc/cpuinfo (bench.harness.provenance records it
    too): the brand string alone does not tell CPU generations apart."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("vendor_id", "cpu family", "model") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip():
                    break
    except OSError:
        pass
    if not fields:
        import platform

        return platform.machine() or "unknown-cpu"
    return (f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')}")


@functools.cache
def _cpu_stem() -> str:
    # the gate's machine kind (bench/gate/store.py: "cpu-2core-AuthenticAMD-family-26-model-2")
    # and torch's CPU capability, which picks the kernels' instruction set
    return _slug(f"cpu-{os.cpu_count()}core-{cpu_id()}-"
                 f"{torch.backends.cpu.get_cpu_capability()}")


@functools.cache
def _cuda_kind(index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    return _slug(f"cuda-{props.name}-sm{props.major}{props.minor}")


def machine_kind(device_type: str, threads: int | None = None,
                 cuda_index: int | None = None) -> str:
    """The name a dispatch table is kept under: on CPUs the gate's machine kind, the
    instruction set torch dispatches to and the thread-count bucket
    ("cpu-2core-AuthenticAMD-family-26-model-2-AVX512-2t"); on CUDA the device's name and
    compute capability ("cuda-NVIDIA-H100-80GB-HBM3-sm90")."""
    if device_type == "cuda":
        return _cuda_kind(torch.cuda.current_device() if cuda_index is None else cuda_index)
    threads = torch.get_num_threads() if threads is None else threads
    return f"{_cpu_stem()}-{thread_bucket(threads)}t"


@dataclass(frozen=True)
class Entry:
    """One measured cell: the winner among `auto`'s candidates for its key."""

    dtype: str
    mode: str
    batch_bucket: int
    size_class: int
    winner: str

    @classmethod
    def from_dict(cls, data: object, where: str) -> Entry:
        """An entry from its JSON object; ValueError naming `where` and the field for a
        missing field or a value of the wrong type or range."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object, got {_json_type(data)}")
        missing = [name for name in cls.__dataclass_fields__ if name not in data]
        if missing:
            raise ValueError(f"{where} has no {', '.join(missing)}")
        for name in ("dtype", "mode", "winner"):
            if not isinstance(data[name], str) or not data[name]:
                raise ValueError(f"{where}.{name} must be a non-empty string, got "
                                 f"{data[name]!r}")
        if data["mode"] not in MODES:
            raise ValueError(f"{where}.mode must be one of {', '.join(MODES)}, got "
                             f"{data['mode']!r}")
        for name, least in (("batch_bucket", 1), ("size_class", 0)):
            value = data[name]
            # bool is an int to Python, NaN a float: neither is a bucket or a size class
            if type(value) is not int or value < least:
                raise ValueError(f"{where}.{name} must be an integer >= {least}, got {value!r}")
        return cls(data["dtype"], data["mode"], data["batch_bucket"], data["size_class"],
                   data["winner"])

    def distance(self, bucket: int, size: int) -> tuple[float, int, int]:
        """Octaves of batch plus size classes away; ties go to the larger batch, then the
        larger size (a larger case's winner is the better-measured one)."""
        return (abs(math.log2(self.batch_bucket) - math.log2(bucket)) + abs(self.size_class - size),
                -self.batch_bucket, -self.size_class)


@dataclass(frozen=True)
class Table:
    """A dispatch table (see the module docstring); `source` is where it was read from."""

    machine_kind: str
    op: str
    entries: tuple[Entry, ...]
    provenance: dict
    source: str = ""
    # the machine kind this table stands in for when it is the nearest measured one (kinds.py)
    stand_in_for: str = ""

    @functools.cached_property
    def _by_key(self) -> dict[tuple[str, str], list[Entry]]:
        out: dict[tuple[str, str], list[Entry]] = {}
        for e in self.entries:
            out.setdefault((e.dtype, e.mode), []).append(e)
        return out

    def lookup(self, dtype: str, call: Call) -> Entry | None:
        """The entry for this call: its own cell, else the nearest of its dtype and mode,
        else None."""
        candidates = self._by_key.get((dtype, call.mode))
        if not candidates:
            return None
        bucket = batch_bucket(call.batch)
        size = size_class(call.inputs, call.paths, call.outputs)
        return min(candidates, key=lambda e: e.distance(bucket, size))

    def as_dict(self) -> dict:
        return {"kind": KIND, "schema": SCHEMA, "machine_kind": self.machine_kind,
                "op": self.op, "provenance": self.provenance,
                "key": "dtype, mode, batch bucket (next power of two >= B), size class "
                       "(ceil(log2(O*I*P)))",
                "entries": [e.__dict__ for e in self.entries]}

    @classmethod
    def from_dict(cls, data: dict, source: str = "") -> Table:
        """A table from its JSON object; ValueError naming `source` and what is wrong for
        anything but a well-formed table of this code's schema."""
        where = source or "table"
        check_header(data, where, "dispatch table", KIND, SCHEMA)
        fields = {"machine_kind": str, "op": str, "provenance": dict, "entries": list}
        defaults = {"op": "estimator", "provenance": {}}
        for name, kind in fields.items():
            if name not in data and name not in defaults:
                raise ValueError(f"{where}: the table has no {name}")
            value = data.get(name, defaults.get(name))
            if not isinstance(value, kind):
                raise ValueError(f"{where}: {name} must be a JSON "
                                 f"{_json_type(kind())}, got {_json_type(value)}")
        entries = tuple(Entry.from_dict(e, f"{where}: entries[{k}]")
                        for k, e in enumerate(data["entries"]))
        return cls(data["machine_kind"], data.get("op", "estimator"), entries,
                   data.get("provenance", {}), source)


def check_header(data: object, where: str, what: str, kind: str, schema: int) -> None:
    """That `data` (a table's parsed JSON) is an object of `kind` at this code's `schema`
    (absent: taken as this code's); ValueError naming `where` and what is wrong otherwise.
    Every table in this folder (`what`: "dispatch table", "layout crossover table") opens so."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not a {what} (a JSON {_json_type(data)}, not an object)")
    if data.get("kind") != kind:
        raise ValueError(f"{where}: not a {what} (kind {data.get('kind')!r})")
    found = data.get("schema", schema)
    if type(found) is not int or found != schema:
        raise ValueError(f"{where}: {what} schema {found!r} is not this code's {schema}")


def _json_type(value: object) -> str:
    """What JSON calls the type of a parsed value (for messages)."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def table_path(kind: str, table_dir: Path | None = None, op: str = "estimator") -> Path:
    """Where `op`'s table for machine kind `kind` is kept: `<kind>.json` for the dense op
    ("estimator"), `<kind>.<op>.json` for another (`...-2t.sparse_estimator.json`). `kind`
    may carry its op already (`table_for` hands `_load` such a name): machine kinds never
    contain "_" or ".<op>", so the name maps to itself."""
    name = kind if op == "estimator" else f"{kind}.{op}"
    # _slug's characters plus "_", which op names use
    stem = re.sub(r"[^A-Za-z0-9._]+", "-", name).strip("-") or "unknown"
    return (TABLE_DIR if table_dir is None else table_dir) / f"{stem}.json"


def table_dir() -> Path:
    """The folder the tables are read from: $GLAI_DISPATCH_DIR when set, else the shipped one
    (`TABLE_DIR`)."""
    chosen = os.environ.get(DIR_VAR)
    return Path(chosen) if chosen else TABLE_DIR


@functools.cache
def _load(kind: str, table_dir: Path) -> Table | None:
    """The table for `kind` in `table_dir`, None when there is none or it cannot be used
    (then with one warning naming the file and why: cached, so once per process)."""
    path = table_path(kind, table_dir)
    if not path.exists():
        return None
    try:
        return Table.from_dict(json.loads(path.read_text()), str(path))
    except (OSError, UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        reason = str(e) if isinstance(e, ValueError) and str(e).startswith(str(path)) \
            else f"{path}: {type(e).__name__}: {e}"
        warnings.warn(f"glai_kernels ignores the dispatch table {reason}; `auto` falls back to "
                      f"the backends' priorities", RuntimeWarning, stacklevel=2)
        return None


def _table_of(kind: str, op: str, directory: Path) -> Table | None:
    """`op`'s table for exactly `kind` in `directory`, None when none, when it is broken (a
    warning says why), or when the file's "op" is another op's (it would pick another op's
    backends)."""
    table = _load(table_path(kind, op=op).stem, directory)
    return table if table is not None and table.op == op else None


def measured_kinds(op: str = "estimator", directory: Path | None = None) -> list[str]:
    """The machine kinds with a table file of `op` in `directory` (default `table_dir()`)."""
    directory = table_dir() if directory is None else directory
    suffix = "" if op == "estimator" else f".{op}"
    found = []
    for path in sorted(directory.glob("*.json")):
        stem = path.stem
        if suffix:
            if not stem.endswith(suffix):
                continue
            stem = stem[: -len(suffix)]
        if kinds.parse(stem) is not None:  # another op's file does not parse as a kind
            found.append(stem)
    return found


@functools.cache
def _nearest_table(kind: str, op: str, directory: Path) -> Table | None:
    """The usable table of the nearest measured kind to `kind` (kinds.py), marked as standing
    in for it; a broken one is passed over (its warning given) for the next nearest."""
    candidates = measured_kinds(op, directory)
    while candidates:
        other = kinds.nearest(kind, candidates)
        if other is None:
            return None
        table = _table_of(other, op, directory)
        if table is not None:
            return replace(table, stand_in_for=kind)
        candidates.remove(other)
    return None


def table_for(device_type: str, threads: int | None = None,
              op: str = "estimator") -> Table | None:
    """The table of `op` for this machine kind in `table_dir()` (read once per process): its
    own, else the nearest measured kind's (`Table.stand_in_for` then names this kind), else
    None."""
    kind = machine_kind(device_type, threads)
    directory = table_dir()
    return _table_of(kind, op, directory) or _nearest_table(kind, op, directory)


_PICKS: dict[tuple, tuple[str | None, str]] = {}
_HAS_TABLE: dict[tuple[str, int, str], bool] = {}


def has_table(device_type: str, op: str = "estimator") -> bool:
    """Whether this machine kind ships a table for `op` (cached: the op asks on every call,
    so a machine without one pays a dict lookup, not a call shape)."""
    where = (device_type, torch.get_num_threads() if device_type == "cpu"
             else torch.cuda.current_device() if device_type == "cuda" else 0, op)
    known = _HAS_TABLE.get(where)
    if known is None:
        known = _HAS_TABLE[where] = (device_type in ("cpu", "cuda")
                                     and table_for(device_type, op=op) is not None)
    return known


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def measured_pick(op: str, device_type: str, dtype: torch.dtype,
                  call: Call) -> tuple[str | None, str]:
    """(the table's winner for this call or None, the rule that gave it, in words).

    Cached per (op, device type, thread count, dtype, call): after the first call of a
    shape this is one dict lookup."""
    threads = torch.get_num_threads() if device_type == "cpu" else 0
    key = (op, device_type, threads, torch.cuda.current_device() if device_type == "cuda"
           else 0, dtype, call)
    hit = _PICKS.get(key)
    if hit is not None:
        return hit
    call = Call(*call)
    table = table_for(device_type, threads, op)
    if table is None:
        answer: tuple[str | None, str] = (None, "no dispatch table for "
                                          f"{machine_kind(device_type, threads)}"
                                          + ("" if op == "estimator" else f" ({op})"))
    else:
        entry = table.lookup(_dtype_name(dtype), call)
        name = Path(table.source).name or table.machine_kind
        if table.stand_in_for:
            name += f" (the nearest measured kind to {table.stand_in_for})"
        answer = ((None, f"{name} has no cell for {_dtype_name(dtype)} {call.mode}")
                  if entry is None else
                  (entry.winner, f"{name}: cell {entry.dtype} {entry.mode} B<="
                                 f"{entry.batch_bucket} size 2^{entry.size_class}"))
    if len(_PICKS) >= _PICKS_MAX:
        _PICKS.clear()
    _PICKS[key] = answer
    return answer


_ON_CLEAR: list[Callable[[], None]] = []


def on_clear(forget: Callable[[], None]) -> None:
    """Call `forget` whenever `clear_cache` runs (the registries' remembered answers: their
    "auto" read these tables)."""
    _ON_CLEAR.append(forget)


def clear_cache() -> None:
    """Forget the tables read and the picks made (tests swap TABLE_DIR), and what was
    decided from them."""
    _load.cache_clear()
    _nearest_table.cache_clear()
    _PICKS.clear()
    _HAS_TABLE.clear()
    for forget in _ON_CLEAR:
        forget()
