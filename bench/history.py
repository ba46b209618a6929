"""The benchmark history: one JSON record per run, kept in the repository under reports/history/.

    path = append(results_json_dict, Path("reports/history"))   # after `python -m bench`
    records = load(Path("reports/history"))                     # oldest first
    frame(records)                                              # one row per measurement

A record is one file, `<machine>/<date>-<commit>-<preset>.json`, so two branches adding
records never conflict in git and a record is never edited after it is written. It is written
to a temporary file in the same folder and renamed into place (`os.replace` is atomic on
POSIX), so a run killed midway leaves at most a `.tmp-*` file, which `load` ignores.

Schema versions: `SCHEMA` is the version written now. `load` reads every older version by
upgrading it step by step (`_UPGRADES`), fills measurement fields an older record lacks with
None and keeps fields it does not know, so a record stays readable as the schema grows. A
record newer than this code is skipped with a warning rather than misread.

- schema 1: speedups over einsum, the one baseline then, in `speedup_vs_einsum`;
- schema 2: the record names its `baseline` backend (the registry's) and the speedup over it
  is `speedup_vs_baseline`; a schema-1 record reads as baseline "einsum". Rows of the
  kept-fraction sweep (bench/kept.py) carry `mu`, the kept fraction, a key field; every
  other row, and every row of a record written before it existed, reads `mu` as None (an
  optional field: no new schema version).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
HISTORY_DIR = ROOT / "reports" / "history"
KIND = "glai-kernels-bench-record"
SCHEMA = 2

# identify one measurement inside a record
ROW_KEY: tuple[str, ...] = ("backend", "head", "batch", "inputs", "paths", "outputs", "dtype",
                            "pass", "device", "mu")
# what a record keeps of each results row (the rest is derivable or bulky)
ROW_FIELDS: tuple[str, ...] = (
    *ROW_KEY, "sweep", "status", "correct", "winner", "median_s", "q25_s", "q75_s", "min_s",
    "gflops", "gbps", "roofline_pct", "bound", "speedup_vs_baseline", "speedup_best",
    "error_ratio", "peak_mem_bytes", "energy_j", "power_w", "nnz",
)
RECORD_FIELDS: tuple[str, ...] = ("commit", "date", "machine", "device", "device_name",
                                  "preset", "command", "baseline")


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
        "machine": prov["machine"], "device": prov.get("device", ""),
        "device_name": prov.get("device_name", ""),
        "preset": results.get("preset", {}).get("name", "custom"),
        "command": results.get("command", ""), "baseline": results.get("baseline", ""),
        "ceilings": results.get("ceilings", {}), "provenance": prov, "rows": rows,
    }


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "unknown"


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


def append(results: dict, history_dir: Path = HISTORY_DIR) -> Path:
    """Add one run's record to the history; returns its path. Never overwrites a record."""
    record = make_record(results)
    folder = history_dir / slug(record["machine"])
    path = folder / record_name(record)
    n = 1
    while path.exists():  # two runs in the same second of the same commit
        n += 1
        path = folder / record_name(record).replace(".json", f"-{n}.json")
    write_atomic(path, json.dumps(record, separators=(",", ":"), default=str) + "\n")
    return path


def upgrade(raw: dict) -> dict | None:
    """`raw` at the current schema; None (with a warning) when it is newer than this code."""
    version = int(raw.get("schema", 1))
    if version > SCHEMA:
        warnings.warn(f"history record schema {version} is newer than this code's {SCHEMA}; "
                      f"skipped (update glai-kernels to read it)", stacklevel=3)
        return None
    while version < SCHEMA:
        raw = _UPGRADES[version](raw)
        version = int(raw["schema"])
    return raw


def parse(raw: dict, path: Path | None = None) -> Record | None:
    raw = upgrade(raw)
    if raw is None:
        return None
    rows = [{**dict.fromkeys(ROW_FIELDS), **row} for row in raw.get("rows", [])]
    fields = {k: str(raw.get(k, "")) for k in RECORD_FIELDS}
    return Record(**fields, ceilings=raw.get("ceilings", {}),
                  provenance=raw.get("provenance", {}), rows=rows, path=path)


def load(history_dir: Path = HISTORY_DIR, machine: str | None = None) -> list[Record]:
    """Every readable record under `history_dir` (optionally one machine's), oldest first.

    Unfinished writes (`.tmp-*`) are ignored; a file that is not a record is an error naming it.
    """
    records = []
    for path in sorted(history_dir.glob("*/*.json")):
        if path.name.startswith(".tmp-"):
            continue
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"history record {path} is not valid JSON: {e}") from None
        if raw.get("kind") != KIND:
            raise ValueError(f"{path} is not a glai-kernels history record "
                             f"(kind {raw.get('kind')!r}, expected {KIND!r})")
        record = parse(raw, path)
        if record is not None and (machine is None or record.machine == machine):
            records.append(record)
    return sorted(records, key=lambda r: (r.date, str(r.path)))


def frame(records: Iterable[Record]) -> pd.DataFrame:
    """One row per measurement of every record, with the record's fields as columns."""
    rows = [{**{k: getattr(r, k) for k in RECORD_FIELDS}, **row}
            for r in records for row in r.rows]
    columns = list(RECORD_FIELDS) + [c for c in ROW_FIELDS if c not in RECORD_FIELDS]
    return pd.DataFrame(rows, columns=columns)
