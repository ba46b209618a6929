"""What the suite measures, as data: sweeps of estimator shapes and the presets that group them.

A `Sweep` varies one axis (batch, inputs, paths or outputs) with the others at a paper
head's values (`glai_kernels.paper_heads.PAPER_HEADS`, docs/ARCHITECTURE.md §3). The paper-heads
grid is the batch
sweep over all six heads. A `Preset` names sweeps, dtypes, passes and how long to time each
measurement. `expand(preset)` turns a preset into the list of `Case`s to run, in order, each
shape once per sweep it belongs to.

Passes (see `bench.passes`): forward; backward (all three gradients, from the forward's saved
state); both (forward + all three gradients, one autograd call); train (forward + dweight
only: GLAI's real training step, where the selector and backbone are frozen).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glai_kernels.contract import Shape
from glai_kernels.paper_heads import PAPER_HEADS

AXES: tuple[str, ...] = ("batch", "inputs", "paths", "outputs")
ALL_PASSES: tuple[str, ...] = ("forward", "backward", "both", "train")
PAPER_BATCHES: tuple[int, ...] = (16, 32, 256, 4096)


@dataclass(frozen=True)
class Sweep:
    """One axis varied over `values`, the others at each head's values.

    For axes other than batch, the batch is `batch`. `dtypes`/`passes` of None mean the
    preset's.
    """

    name: str
    heads: tuple[str, ...]
    axis: str
    values: tuple[int, ...]
    batch: int = 256
    dtypes: tuple[str, ...] | None = None
    passes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        bad = [p for p in self.passes or () if p not in ALL_PASSES]
        if bad:
            raise ValueError(f"sweep {self.name!r}: unknown passes {bad}; known: {ALL_PASSES}")
        if self.axis not in AXES:
            raise ValueError(f"sweep {self.name!r}: axis must be one of {AXES}, got {self.axis!r}")
        unknown = [h for h in self.heads if h not in PAPER_HEADS]
        if unknown:
            raise ValueError(f"sweep {self.name!r}: unknown heads {unknown}; "
                             f"known: {', '.join(PAPER_HEADS)}")
        if not self.values or min(self.values) < 1:
            raise ValueError(f"sweep {self.name!r}: values must be positive, got {self.values}")

    def shapes(self) -> list[tuple[str, Shape]]:
        """(head name, Shape) for every head and value, heads outermost."""
        out = []
        for head in self.heads:
            base = PAPER_HEADS[head].shape(self.batch).as_dict()
            for value in self.values:
                out.append((head, Shape(**{**base, self.axis: value})))
        return out


@dataclass(frozen=True)
class Preset:
    """A named set of sweeps and how to time them.

    `min_time_s`: timed seconds per measurement (at least `rounds` samples);
    `max_call_s`: a case whose roofline floor (the fastest any backend could be, from this
    run's ceilings) exceeds this, or a backend whose fastest warm-up call exceeds three
    times this, is skipped with a note. `ceiling_time_s`: seconds per ceiling measurement.
    """

    name: str
    description: str
    sweeps: tuple[Sweep, ...]
    dtypes: tuple[str, ...]
    passes: tuple[str, ...] = ALL_PASSES
    min_time_s: float = 0.3
    rounds: int = 5
    max_call_s: float = 2.0
    ceiling_time_s: float = 0.3


@dataclass(frozen=True)
class Case:
    """One shape to measure at one dtype and a set of passes, with where it came from."""

    sweep: str
    head: str
    shape: Shape
    dtype: str
    passes: tuple[str, ...] = field(default=ALL_PASSES)


def _axis_sweeps(head: str, batch: int, values: dict[str, tuple[int, ...]],
                 **kwargs) -> tuple[Sweep, ...]:
    # the batch sweep ignores `batch`; the others carry it in their name
    return tuple(Sweep(f"{axis}@{head}" + ("" if axis == "batch" else f"-B{batch}"),
                       (head,), axis, vals, batch=batch, **kwargs)
                 for axis, vals in values.items())


_A1_AXES = {
    "batch": (1, 4, 16, 64, 256, 1024, 4096),
    "inputs": (33, 97, 193, 385, 769, 1537),
    "paths": (16, 32, 64, 128, 256, 512),
    "outputs": (1, 4, 16, 37, 64, 128, 256),
}

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        name="quick",
        description="CI smoke run: the six heads at the paper's batch 16, a short batch "
                    "sweep of A1; float32; forward and forward+backward",
        sweeps=(
            Sweep("heads", tuple(PAPER_HEADS), "batch", (16,)),
            Sweep("batch@A1", ("A1",), "batch", (16, 256)),
        ),
        dtypes=("float32",),
        passes=("forward", "both"),
        min_time_s=0.1,
        rounds=3,
        max_call_s=0.5,
    ),
    Preset(
        name="default",
        description="the six heads at B in {16, 32, 256, 4096} (float32) and {16, 32} "
                    "(bfloat16), all passes; one-axis sweeps of B, I, P, O around A1 at "
                    "B = 256 (float32; forward and forward+backward)",
        sweeps=(
            Sweep("heads", tuple(PAPER_HEADS), "batch", PAPER_BATCHES, dtypes=("float32",)),
            Sweep("heads", tuple(PAPER_HEADS), "batch", PAPER_BATCHES[:2],
                  dtypes=("bfloat16",)),
            *_axis_sweeps("A1", 256, _A1_AXES, dtypes=("float32",),
                          passes=("forward", "both")),
        ),
        dtypes=("float32", "bfloat16"),
        min_time_s=0.2,
        rounds=5,
        max_call_s=0.5,
    ),
    Preset(
        name="full",
        description="for GPUs: the six heads at B in {16, 32, 256, 4096}, one-axis sweeps "
                    "around A1 and B1 at B = 16 and 4096; float32, float16, bfloat16",
        sweeps=(
            Sweep("heads", tuple(PAPER_HEADS), "batch", PAPER_BATCHES),
            *_axis_sweeps("A1", 16, _A1_AXES),
            *_axis_sweeps("A1", 4096, {k: v for k, v in _A1_AXES.items() if k != "batch"}),
            *_axis_sweeps("B1", 16, {
                "batch": (1, 16, 64, 256, 1024, 4096, 16384),
                "inputs": (129, 385, 769, 1281, 2049, 4097),
                "paths": (32, 64, 128, 320, 640, 1280),
                "outputs": (1, 8, 32, 128, 512, 1024),
            }),
        ),
        dtypes=("float32", "float16", "bfloat16"),
        min_time_s=0.5,
        rounds=10,
        max_call_s=10.0,
    ),
)}


def expand(preset: Preset, dtypes: tuple[str, ...] | None = None,
           passes: tuple[str, ...] | None = None) -> list[Case]:
    """Every case of the preset, sweep by sweep; `dtypes`/`passes` override the preset's
    (a sweep that names its own dtypes keeps only those also asked for)."""
    cases = []
    for sweep in preset.sweeps:
        sweep_dtypes = sweep.dtypes or preset.dtypes
        if dtypes is not None:
            sweep_dtypes = (tuple(d for d in sweep_dtypes if d in dtypes) if sweep.dtypes
                            else dtypes)
        sweep_passes = passes or sweep.passes or preset.passes
        for head, shape in sweep.shapes():
            for dtype in sweep_dtypes:
                cases.append(Case(sweep.name, head, shape, dtype, tuple(sweep_passes)))
    return cases
