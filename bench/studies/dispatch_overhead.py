"""What auto's dispatch table adds to a call: `glai-bench dispatch-overhead` (or
`python -m bench.studies.dispatch_overhead`).

Times `registry.resolve` as the op calls it for auto, with the call's key (`op.auto_call`)
against without it (the priorities alone), at A1, B = 16, float32, weight needing a
gradient: on this machine kind's shipped table if there is one, else without a table, and
with a one-cell table for this machine kind written to a temporary folder. Blocks of the
variants are interleaved and the fastest block of each kept, so other load on the CPU falls
on all of them alike.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from bench.harness.timing import MIN_BLOCK_S, time_interleaved, warm
from glai_kernels import dispatch, op, registry


def _best(variants: dict[str, Callable[[], object]], rounds: int = 400) -> dict[str, float]:
    """Microseconds per call of each variant: the fastest of `rounds` interleaved blocks
    (bench/harness/timing.py)."""
    per_call = {name: warm(fn, torch.device("cpu"))[1] for name, fn in variants.items()}
    timed = time_interleaved(variants, per_call, MIN_BLOCK_S * rounds, rounds)
    return {name: t.min_s * 1e6 for name, t in timed.items()}


def measure() -> dict[str, dict[str, float]]:
    """{setting: {"priorities": µs, "auto": µs, "added": µs}}."""
    x, act = torch.randn(16, 384), torch.randn(16, 256)
    weight = torch.randn(37, 384, 256, requires_grad=True)
    device = x.device

    def priorities() -> object:
        return registry.resolve(None, device, x.dtype)

    def auto() -> object:
        return registry.resolve(None, device, x.dtype,
                                op.auto_call(x, act, weight, None, device.type))

    def run() -> dict[str, float]:
        t = _best({"priorities": priorities, "auto": auto})
        return {**t, "added": t["auto"] - t["priorities"]}

    results = {("shipped table" if dispatch.has_table("cpu") else "no table"): run()}
    shipped = dispatch.TABLE_DIR
    with tempfile.TemporaryDirectory() as folder:
        kind = dispatch.machine_kind("cpu")
        dispatch.table_path(kind, Path(folder)).write_text(json.dumps({
            "kind": dispatch.KIND, "schema": dispatch.SCHEMA, "machine_kind": kind,
            "op": "estimator", "provenance": {},
            "entries": [{"dtype": "float32", "mode": "train", "batch_bucket": 16,
                         "size_class": 22, "winner": "torch"}]}))
        try:
            dispatch.TABLE_DIR = Path(folder)
            dispatch.clear_cache()
            results["one-cell table"] = run()
        finally:
            dispatch.TABLE_DIR = shipped
            dispatch.clear_cache()
    return results


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="glai-bench dispatch-overhead",
                            description=__doc__.splitlines()[0]).parse_args(argv)
    for setting, t in measure().items():
        print(f"{setting}: priorities {t['priorities']:.2f} us, auto with the call's key "
              f"{t['auto']:.2f} us, added {t['added']:+.2f} us per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
