"""The GLAI pipeline end to end on the paper's six heads: Table 3, Figure 5, Table 4.

    python -m bench.pipeline --preset quick|default|full --out reports/pipeline

`run(preset, out_dir)` is what `python -m bench` calls. Everything runs offline: built-in
synthetic embeddings and scikit-learn's bundled digits, or users' own embedding files (see
`bench.pipeline.data`). The estimator runs on whichever backend auto (or $GLAI_BACKEND)
picks; the reports say which.

The method itself (training loops, early stopping, episodes, InfoNCE, the protocol and the
paper's per-head settings) is library code, glai_kernels.glai; this package is the
experiment around it: `presets`, `runner` (every head, data set and seed), `data` (users'
files and the built-in data sets) and `report` (tables, tests, plots).
"""

from __future__ import annotations

import pathlib

from bench.pipeline.runner import run_preset


def run(preset: str, out_dir: pathlib.Path, **options) -> None:
    """Run a preset ("quick", "default", "full") and write its reports into out_dir."""
    run_preset(preset, pathlib.Path(out_dir), **options)


__all__ = ["run"]
