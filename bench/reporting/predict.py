"""Roofline PREDICTIONS for the paper's heads on A100 and H100, from datasheet peaks.

Nothing here is measured. For each head (glai_kernels.paper_heads.PAPER_HEADS), batch size, GPU
and precision:

    floor = max(Shape.flops(pass) / peak FLOP/s, Shape.min_bytes(itemsize, pass) / HBM bandwidth)

and the bound is whichever term is larger. Peaks are NVIDIA's datasheet numbers (dense
tensor-core rates, no sparsity); a real kernel reaches some fraction of both. The benchmark
suite measures the same cases on a CUDA machine (`nox -s bench -- --preset full --backends
triton,torch,einsum`) and can label these rows as predictions next to its measurements.

    glai-bench predict    # the Markdown tables in docs/notes/triton.md ("Triton backend")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from glai_kernels.contract import Pass
from glai_kernels.paper_heads import PAPER_HEADS, PaperHead

LABEL = "prediction, datasheet peaks, not measured"


@dataclass(frozen=True)
class Gpu:
    """A GPU's datasheet peaks: FLOP/s per precision and HBM bytes/s."""

    name: str
    flops_per_s: Mapping[str, float]
    bytes_per_s: float


GPUS: dict[str, Gpu] = {
    "A100": Gpu("A100 SXM4 80GB",
                {"bfloat16": 312e12, "float16": 312e12, "tf32": 156e12, "float32": 19.5e12},
                2.039e12),
    "H100": Gpu("H100 SXM5",
                {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.7e12, "float32": 67e12},
                3.35e12),
}
# bytes per element of each precision ("tf32" is float32 storage on TF32 tensor cores)
ITEMSIZE: dict[str, int] = {"bfloat16": 2, "float16": 2, "tf32": 4, "float32": 4}
BATCHES: tuple[int, ...] = (16, 32, 4096)
PRECISIONS: tuple[str, ...] = ("bfloat16", "tf32", "float32")
PASSES: tuple[Pass, ...] = ("forward", "both")


@dataclass(frozen=True)
class Prediction:
    """One predicted time floor; `label` says it is not a measurement."""

    head: str
    batch: int
    gpu: str
    precision: str
    pass_: str
    flops: int
    bytes: int
    compute_s: float
    memory_s: float
    label: str = LABEL

    @property
    def floor_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        """"compute" or "memory": which term sets the floor."""
        return "compute" if self.compute_s >= self.memory_s else "memory"

    def as_dict(self) -> dict:
        return {**asdict(self), "floor_s": self.floor_s, "bound": self.bound}


def predictions(
    heads: Iterable[PaperHead] = PAPER_HEADS.values(),
    batches: Sequence[int] = BATCHES,
    gpus: Sequence[str] = tuple(GPUS),
    precisions: Sequence[str] = PRECISIONS,
    passes: Sequence[Pass] = PASSES,
) -> list[Prediction]:
    """Every (pass, head, batch, GPU, precision) floor, in that nesting order."""
    rows = []
    for pass_ in passes:
        for head in heads:
            for batch in batches:
                shape = head.shape(batch)
                for gpu_name in gpus:
                    gpu = GPUS[gpu_name]
                    for precision in precisions:
                        flops = shape.flops(pass_)
                        nbytes = shape.min_bytes(ITEMSIZE[precision], pass_)
                        rows.append(Prediction(
                            head.name, batch, gpu_name, precision, pass_, flops, nbytes,
                            flops / gpu.flops_per_s[precision], nbytes / gpu.bytes_per_s))
    return rows


def _time(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.3g} µs" if us < 1000 else f"{us / 1000:.3g} ms"


def markdown(rows: Sequence[Prediction]) -> str:
    """One table per pass: a row per (head, batch), a column per (GPU, precision), each cell
    the floor and its bound (M memory, C compute)."""
    columns = sorted({(r.gpu, r.precision) for r in rows},
                     key=lambda c: (list(GPUS).index(c[0]), PRECISIONS.index(c[1])
                                    if c[1] in PRECISIONS else len(PRECISIONS)))
    out = []
    for pass_ in dict.fromkeys(r.pass_ for r in rows):
        cells = {(r.head, r.batch, r.gpu, r.precision): r for r in rows if r.pass_ == pass_}
        keys = list(dict.fromkeys((r.head, r.batch) for r in rows if r.pass_ == pass_))
        out.append(f"Pass `{pass_}` ({LABEL}); M = memory-bound, C = compute-bound.\n")
        out.append("| head | B | GFLOP | MB (2-byte) | "
                   + " | ".join(f"{g} {p}" for g, p in columns) + " |")
        out.append("|---|---:|---:|---:|" + "---:|" * len(columns))
        for head, batch in keys:
            first = next(r for k, r in cells.items() if k[:2] == (head, batch))
            values = []
            for gpu, precision in columns:
                r = cells[(head, batch, gpu, precision)]
                values.append(f"{_time(r.floor_s)} {r.bound[0].upper()}")
            mb = first.bytes / ITEMSIZE[first.precision] * 2 / 1e6
            out.append(f"| {head} | {batch} | {first.flops / 1e9:.3g} | {mb:.3g} | "
                       + " | ".join(values) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="glai-bench predict", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    print(markdown(predictions()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
