"""The dispatch table a run measures for `auto` (glai_kernels/dispatch/), and how well it and
the old priority rule choose.

    build(df, meta, op=...)  -> (table dict, evaluation dict) from a results table
    write(table, out_dir) -> out_dir/dispatch/<machine kind>.json (the dense op's), or
                             <machine kind>.<op>.json (another op's: sparse_estimator)
    install(path)    copies it into glai_kernels/dispatch/, which the package ships
    markdown(meta)   the summary's section

Candidates are the op's backends `auto` may choose on the device (an `auto_priority` for
it), never a bench-only peer. A case is one (dtype, pass, shape) of the op in a mode `auto`
serves (forward, both, train); its best is the fastest correct candidate's median. For the
dense op the cases are the rows without a kept fraction; for the sparse op
(`op="sparse_estimator"`) the kept-fraction sweep's `sparse:NAME` rows, one case per shape and
kept fraction μ (a cell joins every μ of its shapes: the table's key has no K), its `step`
pass (forward, dvalues; only the values train) serving the "train" mode. A cell of
the table (dtype, mode, batch bucket, size class; see glai_kernels.dispatch) may hold several
cases; its winner is the candidate measured correct in all of them with the smallest
geometric-mean slowdown against each case's best.

The evaluation counts, over the run's cases, how often a rule's pick runs within 5% of the
case's best: the table (in sample: built from these very cases), the table built without the
case (held out: how it does on a case it has not seen) and the priorities (the rule `auto`
followed before tables).
"""

from __future__ import annotations

import math
import shutil
from collections import defaultdict
from pathlib import Path

import pandas as pd

from glai_kernels import dispatch, registry
from glai_kernels.dispatch import Call, Entry, Table

WITHIN = 1.05  # a pick within 5% of the best counts as right
DENSE, SPARSE = "estimator", "sparse_estimator"
SPARSE_PREFIX = "sparse:"  # how the kept-fraction sweep names the sparse op's backends
# the kept-fraction sweep's passes as auto's modes: its "step" trains the values alone
SPARSE_MODES = {"forward": "forward", "step": "train"}
# dtype, mode, batch, inputs, paths, outputs, kept fraction (0.0 for the dense op)
CaseKey = tuple[str, str, int, int, int, int, float]


def candidates(device_type: str, op: str = DENSE) -> list[str]:
    """The op's registered backends `auto` may choose on this device type."""
    return [b.name for b in registry.Registry.of(op).backends() if device_type in b.auto_priority]


def _timed_rows(df: pd.DataFrame, device_type: str, op: str = DENSE) -> pd.DataFrame:
    """The candidates' timed rows of the op (right or wrong), one per case, named as the
    op's registry names them and with auto's mode in "pass"."""
    ok = df[df["status"].isin(["ok", "wrong"])]
    has_mu = ok["mu"].notna() if "mu" in ok else pd.Series(False, index=ok.index)
    if op == DENSE:
        ok = ok[ok["pass"].isin(dispatch.MODES) & ok["backend"].isin(candidates(device_type))
                & ~has_mu]
        ok = ok.assign(mu=0.0)
    else:
        names = {f"{SPARSE_PREFIX}{n}": n for n in candidates(device_type, op)}
        ok = ok[ok["pass"].isin(list(SPARSE_MODES)) & ok["backend"].isin(list(names)) & has_mu]
        ok = ok.assign(backend=ok["backend"].map(names), **{"pass": ok["pass"].map(SPARSE_MODES)})
    return ok.drop_duplicates(["backend", "batch", "inputs", "paths", "outputs", "dtype",
                               "pass", "mu"])


def _key(r: dict) -> CaseKey:
    return (str(r["dtype"]), str(r["pass"]), int(r["batch"]), int(r["inputs"]),
            int(r["paths"]), int(r["outputs"]), float(r["mu"]))


def cases(df: pd.DataFrame, device_type: str,
          op: str = DENSE) -> dict[CaseKey, dict[str, float]]:
    """{case: {candidate: median seconds}} of the op's candidates measured correct."""
    right = _timed_rows(df, device_type, op)
    out: dict[CaseKey, dict[str, float]] = defaultdict(dict)
    right = right[(right["status"] == "ok") & (right["correct"] == True)]  # noqa: E712
    for r in right.to_dict("records"):
        out[_key(r)][str(r["backend"])] = float(r["median_s"])
    return dict(out)


def timed(df: pd.DataFrame, device_type: str, op: str = DENSE) -> dict[CaseKey, list[str]]:
    """{case: the candidates timed at it, right or wrong}: a piece of a run may time a
    backend at a few cases only, and the priority rule is judged where its pick was timed."""
    out: dict[CaseKey, list[str]] = defaultdict(list)
    for r in _timed_rows(df, device_type, op).to_dict("records"):
        out[_key(r)].append(str(r["backend"]))
    return dict(out)


def _cell(key: CaseKey) -> tuple[str, str, int, int]:
    dtype, mode, b, i, p, o, _mu = key
    return dtype, mode, dispatch.batch_bucket(b), dispatch.size_class(i, p, o)


def entries(measured: dict[CaseKey, dict[str, float]]) -> list[dict]:
    """The table's entries (JSON-ready, with each cell's evidence) from measured cases."""
    cells: dict[tuple, list[CaseKey]] = defaultdict(list)
    for key in measured:
        cells[_cell(key)].append(key)
    out = []
    for (dtype, mode, bucket, size), keys in sorted(cells.items()):
        # log slowdowns against each case's best, per candidate measured in every case
        names = set.intersection(*(set(measured[k]) for k in keys))
        if not names:  # no candidate ran in all of them: those measured most often compete
            seen = set().union(*(measured[k] for k in keys))
            most = max(sum(n in measured[k] for k in keys) for n in seen)
            names = {n for n in seen if sum(n in measured[k] for k in keys) == most}
        score = {}
        for n in sorted(names):
            logs = [math.log(measured[k][n] / min(measured[k].values()))
                    for k in keys if n in measured[k]]
            score[n] = sum(logs) / len(logs)
        winner = min(score, key=lambda n: (score[n], n))
        out.append({"dtype": dtype, "mode": mode, "batch_bucket": bucket, "size_class": size,
                    "winner": winner, "cases": len(keys),
                    "slowdown": {n: round(math.exp(s), 4) for n, s in sorted(score.items())}})
    return out


def _table(entry_dicts: list[dict], kind: str, provenance: dict | None = None,
           op: str = DENSE) -> Table:
    return Table(kind, op,
                 tuple(Entry(e["dtype"], e["mode"], e["batch_bucket"], e["size_class"],
                             e["winner"]) for e in entry_dicts), provenance or {})


def _priority_pick(device_type: str, dtype: str, ran: list[str],
                   op: str = DENSE) -> str | None:
    """The priority rule's pick among the op's candidates that ran and take this dtype."""
    from bench.harness.passes import dtype_of

    backends = registry.Registry.of(op)
    able = [backends.get(n) for n in candidates(device_type, op) if n in ran
            and dtype_of(dtype) in backends.get(n).dtypes]
    return max(able, key=lambda b: b.auto_priority[device_type]).name if able else None


def evaluate(measured: dict[CaseKey, dict[str, float]], table: Table, device_type: str,
             ran: dict[CaseKey, list[str]], op: str = DENSE) -> dict:
    """{rule: {"within": n, "cases": m}} for the table (in sample and held out) and the
    priorities (picking among the candidates timed at each case, `ran`); a rule whose pick
    was not measured correct on a case misses it, and the table's rules fall back to the
    priorities where they have no entry, as auto does."""
    counts = {rule: {"within": 0, "cases": 0} for rule in ("table", "held_out", "priorities")}
    misses: list[str] = []
    for key, medians in measured.items():
        dtype, mode, b, i, p, o, mu = key
        best = min(medians.values())
        call = Call(mode, b, i, p, o)
        priority = _priority_pick(device_type, dtype, ran.get(key, []), op)
        # as auto does: a table without an entry for the dtype and mode leaves the priorities
        others = {k: v for k, v in measured.items() if k != key}
        held = _table(entries(others), table.machine_kind, op=op).lookup(dtype, call)
        picks = {"table": table.lookup(dtype, call) or priority,
                 "held_out": held or priority,
                 "priorities": priority}
        for rule, pick in picks.items():
            name = pick.winner if isinstance(pick, Entry) else pick
            if name is None:
                continue
            counts[rule]["cases"] += 1
            took = medians.get(name, math.inf)
            if took <= WITHIN * best:
                counts[rule]["within"] += 1
            elif rule == "table":
                kept = f" mu={mu:g}" if op != DENSE else ""
                misses.append(f"{dtype} {mode} B={b} I={i} P={p} O={o}{kept}: {name} "
                              f"{took / best:.2f}x the best ({min(medians, key=medians.get)})")
    return {**counts, "table_misses": misses}


def build(df: pd.DataFrame, meta: dict, kind: str | None = None,
          op: str = DENSE) -> tuple[dict, dict] | None:
    """(`op`'s table, its evaluation) from a run's results, None when no case of the op
    serves `auto`; `kind` names the machine kind when the results come from another machine
    (this one's by default)."""
    prov = meta["provenance"]
    device_type = prov["device"]
    measured = cases(df, device_type, op)
    if not measured:
        return None
    kind = kind or dispatch.machine_kind(device_type, threads=prov.get("threads"))
    provenance = {"command": meta.get("command", ""), "commit": prov.get("commit", ""),
                  "date": prov.get("date", ""), "preset": meta.get("preset", {}).get("name"),
                  "threads": prov.get("threads"), "device_name": prov.get("device_name", ""),
                  "cpu_id": prov.get("cpu_id", ""), "torch_version": prov.get("torch_version"),
                  "cases": len(measured), "candidates": candidates(device_type, op),
                  # a candidate never timed can never win a cell: say which ones competed
                  "measured": sorted({n for times in measured.values() for n in times}),
                  "load_average": prov.get("load_average")}
    entry_dicts = entries(measured)
    table = {"kind": dispatch.KIND, "schema": dispatch.SCHEMA, "machine_kind": kind,
             "op": op, "provenance": provenance,
             "key": "dtype, mode (forward | both | train), batch bucket (next power of two "
                    ">= B), size class (ceil(log2(O*I*P))); a call without its own cell takes "
                    "the nearest of its dtype and mode",
             "entries": entry_dicts}
    evaluation = evaluate(measured, _table(entry_dicts, kind, op=op), device_type,
                          timed(df, device_type, op), op)
    return table, {"machine_kind": kind, "op": op, **evaluation}


def write(table: dict, out_dir: Path) -> Path:
    return write_json(table, dispatch.table_path(table["machine_kind"], out_dir / "dispatch",
                                                 op=table["op"]))


def write_json(table: dict, path: Path) -> Path:
    """`table` as indented JSON at `path` (its folder made), for every table a run writes."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    return path


def install(path: Path) -> Path:
    """Copy a run's table into the package (glai_kernels/dispatch/), which ships it."""
    target = dispatch.TABLE_DIR / path.name
    shutil.copyfile(path, target)
    return target


def _share(c: dict) -> str:
    if not c["cases"]:
        return "no case"
    return f"{c['within']}/{c['cases']} ({100 * c['within'] / c['cases']:.0f}%)"


# where a run's meta keeps each op's table evaluation
META_KEYS = {DENSE: "dispatch", SPARSE: "sparse_dispatch"}


def markdown(meta: dict, op: str = DENSE) -> list[str]:
    """The summary's section on `op`'s `auto`, from its meta entry (empty when absent)."""
    d = meta.get(META_KEYS[op])
    if not d:
        return []
    title = "auto" if op == DENSE else "the sparse op's auto"
    lines = [f"## {title}: the measured dispatch table", "",
             f"This run wrote `{d.get('file', '?')}` for machine kind `{d['machine_kind']}`"
             + (f" (installed as `{d['installed']}`)" if d.get("installed") else "")
             + ". Across the run's cases (dtype, pass in forward/both/train, shape), how often "
             "each rule's pick is within 5% of the fastest backend `auto` may choose:", "",
             "| rule | within 5% of the best |", "|---|---|",
             f"| dispatch table (built from these cases) | {_share(d['table'])} |",
             f"| dispatch table, each case held out of its building | {_share(d['held_out'])} |",
             f"| priorities (the rule before tables) | {_share(d['priorities'])} |", ""]
    if d.get("table_misses"):
        lines += ["Where the table's cell (batch bucket, size class) joins cases with different "
                  "winners, it misses:", ""]
        lines += [f"- {m}" for m in d["table_misses"]]
        lines.append("")
    return lines
