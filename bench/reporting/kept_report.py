"""What the kept-fraction sweep's rows (bench/harness/kept.py) say, for summary.md and the plots.

All ratios are of medians timed in the same run (interleaved, bench/harness/timing.py):

- the crossover per head, batch and pass: the kept fraction μ where the best sparse backend
  and the best dense backend on the masked weight take the same time, interpolated in
  log μ and log time between the two measured μ that bracket it, over the random masks only
  (the matched μ is the pruned head, another structure: bench/harness/kept.py);
- each sparse backend's share of its bytes floor in the forward: `SparseShape.min_bytes`
  over the memory bandwidth this run measured (`bench.harness.ceilings.Ceilings.bandwidth`: the
  cache's for bytes that fit in half of it), divided by the median;
- the GLAI training step against the MLP's at each head's matched μ (docs/ARCHITECTURE.md
  §3: the pruned head) and paper batch: issue 13's target (1), ≤ 1.0×;
- sparse `cpp` against dense `cpp` in the forward at μ = 1%, B = 16, at B1 and B2: its
  target (2), ≥ 20×.
"""

from __future__ import annotations

import math

import pandas as pd

from bench.harness.ceilings import Ceilings
from bench.harness.kept import DENSE, MLP, SPARSE_PREFIX, sparse_label
from bench.harness.sweeps import matched_keep
from glai_kernels.glai import paper_training
from glai_kernels.paper_heads import PAPER_HEADS

STEP_TARGET = 1.0  # GLAI step / MLP step at the matched μ, at most
FORWARD_TARGET = 20.0  # dense cpp / sparse cpp forward at μ = 1%, B = 16, at least
FORWARD_TARGET_HEADS = ("B1", "B2")


def kept_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The timed, correct rows of the kept-fraction sweep (one per backend, head, batch, μ,
    pass)."""
    if "mu" not in df:
        return df.iloc[0:0]
    sub = df[df["mu"].notna() & (df["status"] == "ok")]
    return sub.drop_duplicates(["backend", "head", "batch", "mu", "pass"])


def is_sparse(backend: str) -> bool:
    return backend.startswith(SPARSE_PREFIX)


def best_times(rows: pd.DataFrame) -> pd.DataFrame:
    """Per μ (ascending): the fastest sparse and dense medians (columns sparse, dense,
    mlp; NaN where none was timed) of one head, batch and pass."""
    out = {}
    for mu, at in rows.groupby("mu"):
        sparse = at[at["backend"].map(is_sparse)]["median_s"]
        dense = at[at["backend"].isin(DENSE)]["median_s"]
        mlp = at[at["backend"] == MLP]["median_s"]
        out[mu] = {"sparse": sparse.min() if len(sparse) else math.nan,
                   "dense": dense.min() if len(dense) else math.nan,
                   "mlp": mlp.min() if len(mlp) else math.nan}
    return pd.DataFrame.from_dict(out, orient="index").sort_index()


def crossover(rows: pd.DataFrame) -> tuple[float | None, str]:
    """(μ where best sparse = best dense, or None; a phrase saying it) for one head, batch
    and pass."""
    best = best_times(rows).dropna(subset=["sparse", "dense"])
    if best.empty:
        return None, "not measured"
    ratio = (best["sparse"] / best["dense"]).apply(math.log)
    mus = list(best.index)
    if (ratio < 0).all():
        return None, f"sparse faster at every μ measured (up to {100 * mus[-1]:.3g}%)"
    if (ratio >= 0).all():
        return None, f"dense faster at every μ measured (from {100 * mus[0]:.3g}%)"
    for (m0, r0), (m1, r1) in zip(ratio.items(), list(ratio.items())[1:], strict=False):
        if r0 < 0 <= r1:
            t = r0 / (r0 - r1)
            mu = math.exp(math.log(m0) + t * (math.log(m1) - math.log(m0)))
            return mu, f"{100 * mu:.3g}% (between {100 * m0:.3g}% and {100 * m1:.3g}%)"
    return None, "no single crossing (sparse and dense alternate; see the plot)"


def at_match(rows: pd.DataFrame) -> pd.Series:
    """Which rows are at their head's matched K (the pruned head; the others: random masks)."""
    keep = rows["head"].map(lambda h: matched_keep(PAPER_HEADS[h]) if h in PAPER_HEADS else -1)
    return rows["nnz"] == keep


def _matched(rows: pd.DataFrame, head: str) -> pd.DataFrame:
    return rows[rows["nnz"] == matched_keep(PAPER_HEADS[head])]


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g} ms" if pd.notna(seconds) else "–"


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def markdown(df: pd.DataFrame, meta: dict) -> list[str]:
    """summary.md's section on the kept-fraction sweep; [] when the run has none."""
    rows = kept_rows(df)
    if "mu" not in df or df["mu"].notna().sum() == 0:
        return []
    lines = ["## Sparse kept-path estimator: the kept-fraction sweep", "",
             "Sparse backends on the K kept values, the dense op on the masked [O, I, P] "
             "weight and the MLP the head replaces, timed interleaved in the same run at "
             "each μ (bench/harness/kept.py; plots/kept_fraction.png). `step` is a whole training "
             "step: selector, estimator forward and backward to the path weights and bias, "
             "Adam (GLAI) or SGD (MLP). Ratios are of medians.", ""]
    if rows.empty:
        return [*lines, "No kept-fraction measurement was timed.", ""]
    lines += _crossovers(rows)
    lines += _floor_shares(rows, meta)
    lines += _step_target(rows)
    lines += _forward_target(rows, df)
    return lines


def _crossovers(rows: pd.DataFrame) -> list[str]:
    passes = [p for p in ("forward", "step") if p in set(rows["pass"])]
    out = ["### Crossover: best sparse = best dense (interpolated in log μ)", "",
           "Over the random masks (the matched μ, a pruned head, is left out: its entries "
           "cluster in fewer groups).", "",
           "| head | B | " + " | ".join(passes) + " |", "|---|---|" + "---|" * len(passes)]
    for (head, batch), g in rows[~at_match(rows)].groupby(["head", "batch"], sort=False):
        cells = [crossover(g[g["pass"] == p])[1] for p in passes]
        out.append(f"| {head} | {batch} | " + " | ".join(cells) + " |")
    return [*out, ""]


def _floor_shares(rows: pd.DataFrame, meta: dict) -> list[str]:
    ceilings = Ceilings(**meta["ceilings"])
    fwd = rows[(rows["pass"] == "forward") & rows["backend"].map(is_sparse)
               & rows["bytes"].notna()]
    out = ["### Sparse forward: share of the bytes floor at the matched μ (the pruned head)", "",
           "Bytes floor = `SparseShape.min_bytes` (values, the index arrays the forward "
           "walks, x, act, y) over this run's copy bandwidth (the cache's where they fit in "
           "half of it); share = floor / median.", "",
           "| head | B | μ | K | backend | bytes | median | floor | share |",
           "|---|---|---|---|---|---|---|---|---|"]
    for head in dict.fromkeys(fwd["head"]):
        for _, r in _matched(fwd[fwd["head"] == head], head).iterrows():
            bandwidth, level = ceilings.bandwidth(int(r["bytes"]))
            floor = r["bytes"] / bandwidth
            out.append(f"| {head} | {r['batch']} | {100 * r['mu']:.3g}% | {int(r['nnz'])} | "
                       f"{r['backend']} | {int(r['bytes'])} | {_ms(r['median_s'])} | "
                       f"{_ms(floor)} ({level}) | {100 * floor / r['median_s']:.2g}% |")
    return [*out, ""]


def _step_target(rows: pd.DataFrame) -> list[str]:
    out = [f"### Target: GLAI training step ≤ {STEP_TARGET:g}× the MLP's at the matched μ, "
           "paper batch", "",
           "At the matched μ the head is the one GLAI trains: `match` and the unstructured "
           "prune of a random original MLP (bench/harness/kept.py, `pruned_inputs`).", "",
           "| head | B | μ | MLP step | best sparse step | sparse / MLP | dense cpp step | "
           "dense cpp / MLP | target |", "|---|---|---|---|---|---|---|---|---|"]
    step = rows[rows["pass"] == "step"]
    for head in PAPER_HEADS:
        batch = paper_training(PAPER_HEADS[head]).batch_size
        at = _matched(step[(step["head"] == head) & (step["batch"] == batch)], head)
        if at.empty:
            continue
        mlp = at[at["backend"] == MLP]["median_s"].min()
        sparse = at[at["backend"].map(is_sparse)]
        best = sparse.loc[sparse["median_s"].idxmin()] if len(sparse) else None
        dense = at[at["backend"] == "cpp"]["median_s"].min()
        ratio = best["median_s"] / mlp if best is not None else math.nan
        target = _verdict(ratio <= STEP_TARGET) if pd.notna(ratio) else "not measured"
        out.append(f"| {head} | {batch} | {100 * at['mu'].iloc[0]:.3g}% | {_ms(mlp)} | "
                   + (f"{best['backend']} {_ms(best['median_s'])}" if best is not None else "–")
                   + f" | {ratio:.2f}× | {_ms(dense)} | {dense / mlp:.2f}× | {target} |")
    return [*out, ""]


def _forward_target(rows: pd.DataFrame, df: pd.DataFrame) -> list[str]:
    out = [f"### Target: sparse `cpp` forward ≥ {FORWARD_TARGET:g}× dense `cpp` at μ = 1%, "
           "B = 16", ""]
    label = sparse_label("cpp")
    if label not in set(df["backend"]):
        return [*out, f"Not available: no sparse `cpp` backend ran in this run (`{label}`).", ""]
    for head in FORWARD_TARGET_HEADS:
        at = rows[(rows["head"] == head) & (rows["batch"] == 16) & (rows["pass"] == "forward")
                  & ((rows["mu"] - 0.01).abs() < 1e-9)]
        sparse = at[at["backend"] == label]["median_s"].min()
        dense = at[at["backend"] == "cpp"]["median_s"].min()
        if pd.isna(sparse) or pd.isna(dense):
            out.append(f"- {head}: not measured (sparse cpp {_ms(sparse)}, dense cpp "
                       f"{_ms(dense)})")
            continue
        ratio = dense / sparse
        out.append(f"- {head}: dense cpp {_ms(dense)} / sparse cpp {_ms(sparse)} = "
                   f"{ratio:.1f}×: {_verdict(ratio >= FORWARD_TARGET)}")
    return [*out, ""]
