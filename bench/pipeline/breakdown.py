"""Where a pipeline run's time went: `python -m bench.pipeline.breakdown A/results.json`

From one results.json: the raw wall clock and process CPU time of the training runs per
(data, head) and model (summed over seeds), per seed, GLAI's three phases, and what is left
of the run's wall clock / CPU time outside training (the warm-ups, the m_t logging of the
original MLP, the interleaved cost probes, the reports). Used to fit the default preset to
its time budget (docs/notes/pipeline.md, "Reproduction stability (issue 14)").
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import pandas as pd


def breakdown(path: pathlib.Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(per (data, head, model): wall and CPU seconds of training over seeds and GLAI's
    phases; per (data, head, seed): wall and CPU seconds; totals {run, training, rest})."""
    content = json.loads(pathlib.Path(path).read_text())
    frame = pd.DataFrame(content["records"])
    for column in ("wall_reduced", "wall_convert", "wall_estimator", "t_monitor"):
        if column not in frame:
            frame[column] = float("nan")
    per_model = frame.groupby(["data", "head", "model"], sort=False).agg(
        wall=("seconds", "sum"), cpu=("cpu_seconds", "sum"), epochs=("epochs", "sum"),
        capped=("capped", "sum"), reduced=("wall_reduced", "sum"),
        convert=("wall_convert", "sum"), estimator=("wall_estimator", "sum"),
        m_t=("t_monitor", "sum"))
    per_seed = frame.groupby(["data", "head", "seed"], sort=False).agg(
        wall=("seconds", "sum"), cpu=("cpu_seconds", "sum"))
    meta = content["meta"]
    training_wall, training_cpu = float(frame.seconds.sum()), float(frame.cpu_seconds.sum())
    jobs = meta.get("jobs", 1)
    totals = {"run wall": meta["wall_seconds"], "run CPU": meta["cpu_seconds"],
              "training wall": training_wall, "training CPU": training_cpu,
              # with units in parallel the training runs' walls overlap: no wall remainder
              "rest wall": (meta["wall_seconds"] - training_wall if jobs == 1
                            else f"n/a ({jobs} units at once: their walls overlap)"),
              "rest CPU": meta["cpu_seconds"] - training_cpu,
              "load at the end": meta.get("load_average")}
    return per_model, per_seed, totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline.breakdown",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("results", type=pathlib.Path)
    args = parser.parse_args(argv)
    per_model, per_seed, totals = breakdown(args.results)
    with pd.option_context("display.width", 200, "display.float_format", "{:.1f}".format,
                           "display.max_rows", 200):
        heads = per_model.groupby(level=["data", "head"], sort=False)[["wall", "cpu"]].sum()
        print("per head (training runs, all seeds):\n" + heads.to_string() + "\n")
        print("per model:\n" + per_model.to_string() + "\n")
        print("per seed:\n" + per_seed.to_string() + "\n")
    print("\n".join(f"{k}: {v:.0f} s" if isinstance(v, float) else f"{k}: {v}"
                    for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
