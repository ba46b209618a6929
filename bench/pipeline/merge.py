"""`glai-bench merge --pipeline OUT RUN [RUN ...]`: pipeline runs taken in pieces (shards,
or runs cut off by a lease and run again for the rest) as one report.

Each RUN folder holds a pipeline results.json ({"meta", "records"}, bench/pipeline/report.py).
Their records are concatenated and the report (Table 3, Figure 5, the Wilcoxon tests) is
written again over all of them, as one run of the same units would have. A unit (head, data
set, seed) whose records are in two folders keeps the first folder's, with a note in the
README and in results.json's meta ("merge_notes"). The runs must share a preset, device and
protocol; a shard missing from those given is named in a warning.

    glai-bench merge --pipeline reports/pipeline /scratch/pipeline/shard-*-of-4
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.harness.shards import coverage
from bench.pipeline.runner import write_report_atomically
from glai_kernels.paper_heads import PAPER_HEADS

# what must agree between runs for their records to be one experiment's
SAME = ("preset", "device", "protocol", "sizes")


def is_pipeline_run(folder: str | Path) -> bool:
    """Whether `folder` holds a pipeline results.json (a kernel run's has no "records")."""
    path = Path(str(folder).partition(":")[0]) / "results.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("records"), list) \
        and isinstance(data.get("meta"), dict)


def load(folder: Path) -> tuple[list[dict], dict]:
    """(records, meta) of one pipeline run; ValueError naming the file otherwise."""
    path = Path(folder) / "results.json"
    if not is_pipeline_run(folder):
        raise ValueError(f"{path}: not a pipeline results.json (an object with meta and "
                         f"records)")
    data = json.loads(path.read_text())
    for i, record in enumerate(data["records"]):
        if not isinstance(record, dict) or not all(k in record for k in ("head", "data",
                                                                           "seed", "model")):
            raise ValueError(f"{path}: record {i} lacks head, data, seed or model")
    return data["records"], data["meta"]


def unit_of(record: dict) -> tuple[str, str, int]:
    return record["head"], record["data"], record["seed"]


def merge(runs: list[tuple[Path, list[dict], dict]]) -> tuple[list[dict], dict]:
    """One (records, meta) from pipeline runs (folder, records, meta) of one experiment.
    ValueError when they differ in preset, device or protocol."""
    if not runs:
        raise ValueError("merge --pipeline: give at least one run folder")
    first = runs[0][2]
    for folder, _, meta in runs[1:]:
        differ = [k for k in SAME if meta.get(k) != first.get(k)]
        if differ:
            raise ValueError(f"merge --pipeline: {folder} differs from {runs[0][0]} in "
                             f"{', '.join(differ)}: not runs of one experiment")
    owner: dict[tuple, Path] = {}
    records: list[dict] = []
    notes: list[str] = []
    for folder, run_records, _ in runs:
        seen_here = set()
        for record in run_records:
            unit = unit_of(record)
            if owner.setdefault(unit, folder) != folder:
                if unit not in seen_here:
                    notes.append(f"{unit[0]} on {unit[1]}, seed {unit[2]} is in both "
                                 f"{owner[unit]} and {folder}: the first's records kept")
                    seen_here.add(unit)
                continue
            records.append(record)
    order = list(PAPER_HEADS)
    # the unsharded run's order: heads as the paper lists them, then seeds (stable otherwise)
    records.sort(key=lambda r: (order.index(r["head"].split("-")[0])
                                if r["head"].split("-")[0] in order else len(order), r["seed"]))
    metas = [m for _, _, m in runs]
    meta = {k: v for k, v in first.items() if k not in ("shard", "units")}
    meta.update({
        "data": {k: v for m in metas for k, v in (m.get("data") or {}).items()},
        "seeds": sorted({r["seed"] for r in records}),
        "wall_seconds": sum(m.get("wall_seconds", 0.0) for m in metas),
        "cpu_seconds": sum(m.get("cpu_seconds", 0.0) for m in metas),
        "merged_from": [{"folder": str(f), "date": m.get("date", ""),
                         "records": len(r), **({"shard": m["shard"]} if m.get("shard") else {}),
                         **({"units": m["units"]} if m.get("units") else {})}
                        for f, r, m in runs],
        "merge_notes": notes,
    })
    timed_out = [u for m in metas for u in (m.get("units") or {}).get("timed_out", [])]
    failed = [u for m in metas for u in (m.get("units") or {}).get("failed", [])]
    done = {f"{h} on {d}, seed {s}" for h, d, s in owner}
    if timed_out or failed:  # coverage_note names them in the README
        meta["units"] = {"planned": [], "done": sorted(done), "partial": False,
                         "timed_out": timed_out, "failed": failed}
    shards = [m["shard"] for m in metas if m.get("shard")]
    if shards:
        meta["shards"] = coverage(shards)
    return records, meta


def main_merge(out_dir: Path, folders: list[str]) -> int:
    """`glai-bench merge --pipeline`: load, merge and write; the exit status."""
    try:
        runs = [(Path(f), *load(Path(f))) for f in folders]
        records, meta = merge(runs)
    except ValueError as e:
        print(f"glai-bench merge: error: {e}", file=sys.stderr)
        return 2
    for note in meta["merge_notes"]:
        print(f"glai-bench merge: note: {note}", file=sys.stderr)
    missing = (meta.get("shards") or {}).get("missing")
    if missing:
        print(f"glai-bench merge: warning: shard(s) {', '.join(map(str, missing))} of "
              f"{meta['shards']['count']} missing: their units are not in the report",
              file=sys.stderr)
    write_report_atomically(records, meta, out_dir)
    print(f"wrote {out_dir} ({len(records)} records from {len(runs)} runs)")
    return 0
