"""The benchmark history: one JSON record per run, kept in the repository under reports/history/.

    path = append(results_json_dict, Path("reports/history"))   # after `python -m bench`
    records = load(Path("reports/history"))                     # oldest first
    frame(records)                                              # one row per measurement

A record is one file, `<machine kind>/<date>-<commit>-<preset>.json` (`machine_kind`: on a
CPU the label and the CPU's vendor, family and model), so two branches adding
records never conflict in git and a record is never edited after it is written. It is written
to a temporary file in the same folder and hard-linked into place under a name nobody has
taken (`os.link` fails on an existing name, atomically, so two processes appending in the same
second each get their own `-2`, `-3`... name), then the temporary name is removed. A run killed
midway leaves at most a `.tmp-*` file, which `load` ignores.

A file that is not a record (unreadable, not JSON, not an object, without the fields a run
has: `REQUIRED_FIELDS`, rows with their `ROW_KEY`) is skipped by `load` with a
`HistoryWarning` naming it and saying why, so one bad file never hides the others; a JSON
object of another `kind` is an error naming it (something else was put in the history).

Schema versions: `SCHEMA` is the version written now. `load` reads every older version by
upgrading it step by step (`_UPGRADES`), fills measurement fields an older record lacks with
None and keeps fields it does not know, so a record stays readable as the schema grows. A
record newer than this code is skipped with a warning rather than misread.

- schema 1: speedups over einsum, the one baseline then, in `speedup_vs_einsum`;
- schema 2: the record names its `baseline` backend (the registry's) and the speedup over it
  is `speedup_vs_baseline`; a schema-1 record reads as baseline "einsum". Rows of the
  kept-fraction sweep (bench/harness/kept.py) carry `mu`, the kept fraction, a key field; every
  other row, and every row of a record written before it existed, reads `mu` as None (an
  optional field: no new schema version).
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
HISTORY_DIR = ROOT / "reports" / "history"
KIND = "glai-kernels-bench-record"
SCHEMA = 2

# identify one measurement inside a record
ROW_KEY: tuple[str, ...] = ("backend", "head", "batch", "inputs", "paths", "outputs", "dtype",
                            "pass", "device", "mu")
# key fields a row may lack (read as None): `mu` exists only in kept-fraction rows and in
# records written since it was added
OPTIONAL_ROW_KEY: tuple[str, ...] = ("mu",)
# what a record keeps of each results row (the rest is derivable or bulky)
ROW_FIELDS: tuple[str, ...] = (
    *ROW_KEY, "sweep", "status", "correct", "winner", "median_s", "q25_s", "q75_s", "min_s",
    "gflops", "gbps", "roofline_pct", "bound", "speedup_vs_baseline", "speedup_best",
    "error_ratio", "peak_mem_bytes", "energy_j", "power_w", "nnz",
)
RECORD_FIELDS: tuple[str, ...] = ("commit", "date", "machine", "device", "device_name",
                                  "preset", "command", "baseline")
# what a run's record cannot lack (non-empty strings); `rows` is required too
REQUIRED_FIELDS: tuple[str, ...] = ("commit", "date", "machine", "preset")
# the JSON type each row field must have when present and not null (the dashboard groups,
# sorts, formats and multiplies them: one wrong type would stop the whole page)
_TEXT, _INTEGER, _NUMBER, _FLAG = "a string", "an integer", "a number", "true or false"
ROW_TYPES: dict[str, str] = {
    **dict.fromkeys(("backend", "head", "dtype", "pass", "device", "sweep", "status", "bound"),
                    _TEXT),
    **dict.fromkeys(("batch", "inputs", "paths", "outputs"), _INTEGER),
    **dict.fromkeys(("mu", "median_s", "q25_s", "q75_s", "min_s", "gflops", "gbps",
                     "roofline_pct", "speedup_vs_baseline", "speedup_best", "error_ratio",
                     "peak_mem_bytes", "energy_j", "power_w", "nnz"), _NUMBER),
    **dict.fromkeys(("correct", "winner"), _FLAG),
}


class HistoryWarning(UserWarning):
    """A history file skipped: the message names the file and the reason."""


def _named_baseline(raw: dict) -> dict:
    """Schema 1 -> 2: every schema-1 run timed against einsum, hard-wired then as the
    baseline; its speedup column takes the neutral name."""
    rows = [{("speedup_vs_baseline" if k == "speedup_vs_einsum" else k): v
             for k, v in row.items()} for row in raw.get("rows", [])]
    return {**raw, "schema": 2, "baseline": "einsum", "rows": rows}


# version -> function taking a record of that version to the next; add one when SCHEMA grows
_UPGRADES: dict[int, Callable[[dict], dict]] = {1: _named_baseline}


@dataclass(frozen=True)
class Record:
    """One run: who/where/what (`RECORD_FIELDS`), the same-run ceilings and the measurements.
    `baseline` is the backend its speedups are over."""

    commit: str
    date: str
    machine: str
    device: str
    device_name: str
    preset: str
    command: str
    baseline: str
    ceilings: dict
    provenance: dict
    rows: list[dict]
    path: Path | None = None


def make_record(results: dict) -> dict:
    """The record (a JSON-ready dict) of one `results.json` as `python -m bench` writes it."""
    prov = results["provenance"]
    rows = [{k: row.get(k) for k in ROW_FIELDS} for row in results["rows"]]
    return {
        "kind": KIND, "schema": SCHEMA,
        "commit": prov.get("commit", "unknown"), "date": prov["date"],
        "machine": machine_kind(prov), "device": prov.get("device", ""),
        "device_name": prov.get("device_name", ""),
        "preset": results.get("preset", {}).get("name", "custom"),
        "command": results.get("command", ""), "baseline": results.get("baseline", ""),
        "ceilings": results.get("ceilings", {}), "provenance": prov, "rows": rows,
    }


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "unknown"


def machine_kind(provenance: dict) -> str:
    """What runs are compared within (the history's folders, the dashboard's trends, the gate's
    baselines): the machine label and, on a CPU, the CPU's vendor, family and model. Two CPUs
    behind one label ("cpu-2core") differ in instruction sets and caches, so their times and
    ratios are not one series."""
    kind = provenance["machine"]
    if provenance.get("device", "cpu") == "cpu":
        kind += f"-{provenance.get('cpu_id') or 'unknown-cpu'}"
    return slug(kind)


def record_name(record: dict) -> str:
    """`<date>-<commit[:12]>-<preset>.json`, dates sortable (20261122T031500Z)."""
    date = re.sub(r"[^0-9T]", "", record["date"][:19]) + "Z"
    commit = record["commit"][:12] + ("-dirty" if record["commit"].endswith("-dirty") else "")
    return f"{date}-{slug(commit)}-{slug(record['preset'])}.json"


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old state or the whole new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the history from other users
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json_object(path: Path, what: str) -> dict:
    """The JSON object in `path`; ValueError naming the file and `what` it should hold
    ("baseline", "results file") when it cannot be read, is not JSON, or is not an object."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path}: {what} not readable as JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: {what} is a JSON {type(raw).__name__}, expected an object")
    return raw


def _create_new(path: Path, text: str) -> None:
    """Write `text` to `path` only if no such file exists (FileExistsError otherwise)."""
    with open(path, "x") as f:
        try:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
    os.chmod(path, 0o644)


def _link_new(tmp: str, folder: Path, name: str) -> Path:
    """Hard-link `tmp` as `folder/name`, or `name-2`, `name-3`... when taken; the path used.

    `os.link` refuses an existing name atomically, so concurrent writers never share one.
    Where the file system has no hard links, an exclusive create takes the name instead and
    the bytes are written into it (a reader may then see the file before it is whole).
    """
    n = 1
    while True:
        path = folder / (name if n == 1 else name.replace(".json", f"-{n}.json"))
        try:
            try:
                os.link(tmp, path)
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS):
                    raise
                _create_new(path, Path(tmp).read_text())
            return path
        except FileExistsError:
            n += 1


def append(results: dict, history_dir: Path = HISTORY_DIR) -> Path:
    """Add one run's record to the history; returns its path. Never overwrites a record,
    also when other processes append the same run at the same time."""
    record = make_record(results)
    folder = history_dir / slug(record["machine"])
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    try:
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the history from other users
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return _link_new(tmp, folder, record_name(record))
    finally:
        Path(tmp).unlink(missing_ok=True)


class RecordError(ValueError):
    """Why a file is not a readable record (becomes a HistoryWarning naming the file)."""


def upgrade(raw: dict, path: Path | None = None) -> dict | None:
    """`raw` at the current schema; None (with a warning) when it is newer than this code."""
    try:
        version = int(raw.get("schema", 1))
    except (TypeError, ValueError):
        raise RecordError(f"schema {raw.get('schema')!r} is not a version number") from None
    if version > SCHEMA:
        warnings.warn(f"history record {path or ''}: schema {version} is newer than this "
                      f"code's {SCHEMA}; skipped (update glai-kernels to read it)",
                      HistoryWarning, stacklevel=3)
        return None
    while version < SCHEMA:
        if version not in _UPGRADES:
            raise RecordError(f"schema {version} is unknown (this code reads 1..{SCHEMA})")
        try:
            raw = _UPGRADES[version](raw)
            version = int(raw["schema"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RecordError(f"its upgrade from schema {version} failed: {e!r}") from None
    return raw


def validate(raw: dict) -> None:
    """Raise RecordError naming the first thing `raw` (at the current schema) lacks as a run."""
    missing = [k for k in REQUIRED_FIELDS if not isinstance(raw.get(k), str) or not raw[k]]
    if missing:
        raise RecordError(f"missing or empty required field(s) {', '.join(missing)}")
    rows = raw.get("rows")
    if not isinstance(rows, list):
        raise RecordError(f"rows is {type(rows).__name__}, expected a list of measurements")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise RecordError(f"rows[{i}] is {type(row).__name__}, expected an object")
        lacking = [k for k in ROW_KEY if k not in row and k not in OPTIONAL_ROW_KEY]
        if lacking:
            raise RecordError(f"rows[{i}] lacks {', '.join(lacking)}")
        for k, expected in ROW_TYPES.items():
            value = row.get(k)
            if value is not None and not _has_type(value, expected):
                raise RecordError(f"rows[{i}].{k} is {value!r}, expected {expected}")
    for k in ("ceilings", "provenance"):
        if not isinstance(raw.get(k, {}), dict):
            raise RecordError(f"{k} is {type(raw[k]).__name__}, expected an object")
    provenance = raw.get("provenance", {})
    for k in ("machine", "device", "cpu_id"):  # what machine_kind reads
        if provenance.get(k) is not None and not isinstance(provenance[k], str):
            raise RecordError(f"provenance.{k} is {provenance[k]!r}, expected a string")


def _has_type(value: object, expected: str) -> bool:
    """Whether a JSON value is of ROW_TYPES' `expected` kind (a bool is not a number)."""
    if expected == _TEXT:
        return isinstance(value, str)
    if expected == _FLAG:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if expected == _INTEGER else isinstance(value, int | float)


def parse(raw: dict, path: Path | None = None) -> Record | None:
    """The Record of `raw` (a record's JSON object); None when its schema is newer than this
    code; RecordError when it is not a run's record."""
    raw = upgrade(raw, path)
    if raw is None:
        return None
    validate(raw)
    rows = [{**dict.fromkeys(ROW_FIELDS), **row} for row in raw["rows"]]
    fields = {k: str(raw.get(k, "")) for k in RECORD_FIELDS}
    provenance = raw.get("provenance", {})
    if provenance.get("machine"):
        # records written before machine_kind named their CPU machine by label alone
        fields["machine"] = machine_kind(provenance)
    return Record(**fields, ceilings=raw.get("ceilings", {}),
                  provenance=raw.get("provenance", {}), rows=rows, path=path)


def read(path: Path) -> Record | None:
    """The record in `path`; None, with a HistoryWarning naming the file and the reason,
    when it cannot be read as one. A JSON object of another kind raises ValueError."""
    try:
        text = path.read_text()
        if not text.strip():
            raise ValueError("empty file")
        raw = json.loads(text)
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        warnings.warn(f"history record {path} skipped: not readable JSON ({e})",
                      HistoryWarning, stacklevel=3)
        return None
    if not isinstance(raw, dict):
        warnings.warn(f"history record {path} skipped: {type(raw).__name__} where a JSON "
                      f"object was expected", HistoryWarning, stacklevel=3)
        return None
    if "kind" in raw and raw["kind"] != KIND:
        raise ValueError(f"{path} is not a glai-kernels history record "
                         f"(kind {raw.get('kind')!r}, expected {KIND!r})")
    try:
        if "kind" not in raw:
            raise RecordError(f"no kind (expected {KIND!r})")
        return parse(raw, path)
    except RecordError as e:
        warnings.warn(f"history record {path} skipped: {e}", HistoryWarning, stacklevel=3)
        return None


def load(history_dir: Path = HISTORY_DIR, machine: str | None = None) -> list[Record]:
    """Every readable record under `history_dir` (optionally one machine's), oldest first.

    Unfinished writes (`.tmp-*`) are ignored; a file that is not a record is skipped with a
    HistoryWarning naming it and the reason; a JSON object of another kind is a ValueError.
    """
    records = []
    for path in sorted(history_dir.glob("*/*.json")):
        if path.name.startswith(".tmp-"):
            continue
        record = read(path)
        if record is not None and (machine is None or record.machine == machine):
            records.append(record)
    return sorted(records, key=lambda r: (r.date, str(r.path)))


def frame(records: Iterable[Record]) -> pd.DataFrame:
    """One row per measurement of every record, with the record's fields as columns."""
    rows = [{**{k: getattr(r, k) for k in RECORD_FIELDS}, **row}
            for r in records for row in r.rows]
    columns = list(RECORD_FIELDS) + [c for c in ROW_FIELDS if c not in RECORD_FIELDS]
    return pd.DataFrame(rows, columns=columns)
